// A chunk's state in a file: p, m and v (12 bytes per parameter), written
// and fsynced, with an XXH3 checksum of the contents kept by whoever names
// the file -- a host-memory chunk's ChunkRecord when its shard server stops
// cleanly, or a checkpoint's manifest. Writes stream at the disk's speed:
// direct I/O in pieces of 8 MiB kept in flight by io_uring, from 4
// KiB-aligned memory (AllocateStateBuffer, an ArenaState, a host-tier
// extent). Stateless functions; ArenaState is not thread-safe.
#ifndef STRATA_SHARD_SAVED_CHUNK_H_
#define STRATA_SHARD_SAVED_CHUNK_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "shard/chunk_state.h"
#include "shard/state_arena.h"

namespace strata {

struct FreeFloats {
  void operator()(float* p) const { std::free(p); }
};
// p, m and v of a chunk, contiguous (3n floats), 4 KiB-aligned, its pages
// faulted in.
using StateBuffer = std::unique_ptr<float[], FreeFloats>;
StateBuffer AllocateStateBuffer(uint64_t num_params);

// A chunk's state as its file holds it (p, m, v: 3n contiguous floats) in
// the memory of a StateArena, given back with the object. Move-only.
class ArenaState {
 public:
  ArenaState() = default;
  // StateBytes(num_params) of the arena; RESOURCE_EXHAUSTED when it cannot
  // have them.
  static absl::StatusOr<ArenaState> Take(StateArena* arena, uint64_t num_params);
  ArenaState(ArenaState&& other) noexcept { *this = std::move(other); }
  ArenaState& operator=(ArenaState&& other) noexcept;
  ~ArenaState() { Reset(); }

  bool empty() const { return arena_ == nullptr; }
  float* data() const { return data_; }
  uint64_t num_params() const { return num_params_; }
  StateView view() const {
    return StateView{data_, data_ + num_params_, data_ + 2 * num_params_, nullptr};
  }
  // Copies `view`'s p, m and v in.
  void CopyFrom(const StateView& view);
  // Gives the memory back; empty() after.
  void Reset();

 private:
  StateArena* arena_ = nullptr;
  float* data_ = nullptr;
  uint64_t num_params_ = 0;
};

// Writes the state of `num_params` parameters (3n floats: p, m, v) to `path`
// and syncs it; returns the checksum. Direct I/O when the memory is 4
// KiB-aligned and the file system has it, buffered otherwise. The I/O error
// naming the file on failure.
absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const float* state,
                                        uint64_t num_params);
// The checksum SaveChunkState() would return for the same state, without
// writing it (a replica's state compared with its primary's file).
uint64_t ChecksumChunkState(const float* state, uint64_t num_params);
// SaveChunkState() to `path`, or ChecksumChunkState() when `path` is empty.
absl::StatusOr<uint64_t> SaveOrChecksumChunkState(const std::string& path, const float* state,
                                                  uint64_t num_params);
// Reads `path` into `state` (3n floats: p, m, v), verifying the checksum as
// the pieces arrive: DATA_LOSS naming the file when it is missing or its size
// or checksum is not the recorded one. Direct I/O in large pieces kept in
// flight when `state` is 4 KiB-aligned (AllocateStateBuffer), buffered
// otherwise.
absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            float* state);

// Small files beside a saved state (a chunk's copy of the step before):
// `bytes` written to `path` and synced; returns their XXH3.
absl::StatusOr<uint64_t> SaveBytes(const std::string& path, absl::string_view bytes);
// The `size` bytes of `path`: DATA_LOSS naming the file when it is missing
// or its size or checksum is not the recorded one.
absl::StatusOr<std::string> LoadBytes(const std::string& path, uint64_t checksum, size_t size);

}  // namespace strata

#endif  // STRATA_SHARD_SAVED_CHUNK_H_
