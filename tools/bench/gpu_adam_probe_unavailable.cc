// GpuFusedAdamSeconds() where strata is built without the CUDA toolkit.
#include "tools/bench/gpu_worker_bench.h"

namespace strata {

absl::StatusOr<double> GpuFusedAdamSeconds(uint64_t, DType) {
  return absl::FailedPreconditionError("this build of strata has no CUDA");
}

}  // namespace strata
