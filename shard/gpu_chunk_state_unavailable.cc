// The GPU chunk state where strata is built without the CUDA toolkit.
#include "shard/gpu_chunk_state.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ChunkState>> CreateGpuChunkState(Tier*, std::shared_ptr<StagingPool>,
                                                                StateShape, DType) {
  return absl::FailedPreconditionError(
      "GPU chunk state: this build of strata has no CUDA support (toolkit not found)");
}

}  // namespace strata
