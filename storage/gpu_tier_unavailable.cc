// The GPU tier where strata is built without the CUDA toolkit.
#include "storage/gpu_tier.h"

namespace strata {

int GpuCount() { return 0; }

absl::StatusOr<std::unique_ptr<Tier>> OpenGpuTier(int, uint64_t) {
  return absl::FailedPreconditionError(
      "GPU tier: this build of strata has no CUDA support (toolkit not found)");
}

absl::Status PinForGpu(void*, uint64_t) {
  return absl::FailedPreconditionError(
      "pinning for the GPU: this build of strata has no CUDA support (toolkit not found)");
}

void UnpinForGpu(void*) {}

}  // namespace strata
