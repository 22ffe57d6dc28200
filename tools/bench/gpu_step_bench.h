// strata-bench gpu-step: a shard server's whole step over chunks in a GPU
// tier on GPU 0 (AdamW on the GPU; tools/bench/server_step_rig.h), against
// the bus it needs, timed in the same run: e bytes per parameter go to the
// GPU (the gradient) while e come back (the copy), so the bound is
// min(to_gpu, from_gpu) / e parameters per second, with both directions timed
// at once over pinned memory, 4 copies in flight each way; and beside the
// same step over host-tier chunks. FAILED_PRECONDITION without a GPU.
// Returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_GPU_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_GPU_STEP_BENCH_H_

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/bench/kernel_bench.h"

namespace strata {

absl::StatusOr<nlohmann::json> BenchGpuStep(const KernelBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_GPU_STEP_BENCH_H_
