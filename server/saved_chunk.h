// A chunk's state in a file: p, m and v (12 bytes per parameter), written
// and fsynced, with an XXH3 checksum of the contents kept by whoever names
// the file -- a host-memory chunk's ChunkRecord when its shard server stops
// cleanly, or a checkpoint's manifest. Writes stream at the disk's speed:
// direct I/O in pieces of BlockPool::kBlockBytes kept in flight by io_uring,
// from 4 KiB-aligned memory: one buffer (AllocateStateBuffer) or the blocks
// of a BlockedState. Stateless functions; BlockedState is not thread-safe.
#ifndef STRATA_SERVER_SAVED_CHUNK_H_
#define STRATA_SERVER_SAVED_CHUNK_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/block_pool.h"
#include "server/chunk_state.h"

namespace strata {

struct FreeFloats {
  void operator()(float* p) const { std::free(p); }
};
// p, m and v of a chunk, contiguous (3n floats), 4 KiB-aligned, its pages
// faulted in.
using StateBuffer = std::unique_ptr<float[], FreeFloats>;
StateBuffer AllocateStateBuffer(uint64_t num_params);

// The state of a chunk as its file holds it (p, m, v: 3n floats) in blocks
// of a BlockPool: block k holds bytes [k, k + 1) * kBlockBytes of it (the
// last one may be shorter: BlockPool::Take()). The blocks go back to the pool
// with the object. Move-only.
class BlockedState {
 public:
  BlockedState() = default;
  // RESOURCE_EXHAUSTED when the pool cannot have the blocks.
  static absl::StatusOr<BlockedState> Take(BlockPool* pool, uint64_t num_params);
  BlockedState(BlockedState&& other) noexcept { *this = std::move(other); }
  BlockedState& operator=(BlockedState&& other) noexcept;
  ~BlockedState() { Reset(); }

  bool empty() const { return pool_ == nullptr; }
  // Copies `view`'s p, m and v in.
  void CopyFrom(const StateView& view);
  absl::Span<std::byte* const> blocks() const { return blocks_; }
  uint64_t num_params() const { return num_params_; }
  // Gives the blocks back; empty() after.
  void Reset();

 private:
  BlockPool* pool_ = nullptr;
  std::vector<std::byte*> blocks_;
  uint64_t num_params_ = 0;
};

// Writes the state of `num_params` parameters (3n floats: p, m, v) to `path`
// and syncs it; returns the checksum. Direct I/O when the memory is 4
// KiB-aligned and the file system has it, buffered otherwise. The I/O error
// naming the file on failure.
absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const float* state,
                                        uint64_t num_params);
absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const BlockedState& state);
// Reads `path` into `state` (3n floats: p, m, v), verifying the checksum as
// the pieces arrive: DATA_LOSS naming the file when it is missing or its size
// or checksum is not the recorded one. Direct I/O in large pieces kept in
// flight when `state` is 4 KiB-aligned (AllocateStateBuffer), buffered
// otherwise.
absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            float* state);

}  // namespace strata

#endif  // STRATA_SERVER_SAVED_CHUNK_H_
