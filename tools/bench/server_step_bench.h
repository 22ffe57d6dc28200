// strata-bench server-step: a shard server's whole step over chunks in the
// host tier (tools/bench/server_step_rig.h), against the AdamW kernel alone
// over the same N and T, in the same run. Returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/bench/kernel_bench.h"

namespace strata {

absl::StatusOr<nlohmann::json> BenchServerStep(const KernelBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
