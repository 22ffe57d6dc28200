// strata-bench server-step: a shard server's whole step over host-tier
// chunks without the network: gradients arrive as 2 MiB pieces (as pushes
// do), are staged into their chunks, and each completed chunk is applied on
// a pool of T threads (as the step executor does). In the same run, the
// AdamW kernel alone over the same N and T; the figure is the ratio.
#ifndef STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/bench/kernel_bench.h"

namespace strata {

absl::StatusOr<nlohmann::json> BenchServerStep(const KernelBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
