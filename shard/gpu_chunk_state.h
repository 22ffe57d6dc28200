// GpuChunkState: a chunk's state (p, m, v in FP32 or 8-bit moments; laid out
// as core/chunk_bytes.h says) in one extent of a GPU tier, followed by a
// scratch area of one element per parameter in the job's dtype. Update()
// copies the pushed gradients into the scratch (through a staging buffer of
// the job's: a memcpy on the calling thread, then DMA when the buffer is
// pinned for the GPU, overlapping the next push's memcpy), runs the CUDA
// AdamW kernel on p, m, v in place (writing the low-precision copy over the
// gradients it has read) and copies that back to host memory: per parameter
// and step, 2 bytes cross the bus each way (FP16/BF16). Load() copies the state into host
// memory that Release() frees, and Commit() copies it back: for reads,
// writes and checkpoints, not steps.
//
// An Update() that fails before the kernel leaves the state as it was; a
// failure after the launch is a device fault (CUDA errors after a launch are
// sticky), after which the state is undefined. The state does not survive a
// restart (durable() is false), like the host tier's.
//
// Not thread-safe: the owning Chunk serializes calls (chunk_state.h).
// Built where the CUDA toolkit is found; elsewhere Create() refuses.
#ifndef STRATA_SHARD_GPU_CHUNK_STATE_H_
#define STRATA_SHARD_GPU_CHUNK_STATE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/round_up.h"
#include "shard/chunk_state.h"
#include "storage/tier.h"
#include "strata/types.h"

namespace strata {

// Bytes of the staging buffers a job whose chunks have `num_params` in
// `dtype` needs for its GPU-tier chunks.
inline uint64_t GpuStagingBytes(uint64_t num_params, DType dtype) {
  return num_params * DTypeSize(dtype);
}

// Where the scratch starts in a GPU chunk state's extent: after the state,
// aligned for any dtype.
inline uint64_t GpuScratchOffset(StateShape shape) {
  constexpr uint64_t kAlignment = 256;
  return RoundUp(shape.bytes(), kAlignment);
}

// Tier bytes a chunk of `shape` in `dtype` takes in a GPU tier.
inline uint64_t GpuChunkStateBytes(StateShape shape, DType dtype) {
  return GpuScratchOffset(shape) + shape.num_params * DTypeSize(dtype);
}

// A zeroed state of `shape` in `gpu` (a GPU tier) whose updates take
// buffers of at least GpuStagingBytes(shape.num_params, dtype) from
// `staging`. RESOURCE_EXHAUSTED when it does not fit; FAILED_PRECONDITION
// where strata was built without CUDA.
absl::StatusOr<std::unique_ptr<ChunkState>> CreateGpuChunkState(
    Tier* gpu, std::shared_ptr<StagingPool> staging, StateShape shape, DType dtype);

}  // namespace strata

#endif  // STRATA_SHARD_GPU_CHUNK_STATE_H_
