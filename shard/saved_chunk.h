// A chunk's state in a file: p, m and v (state_view.h), written
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
#include "core/path_root.h"
#include "shard/chunk_state.h"
#include "shard/state_arena.h"

namespace strata {

// The size of the direct I/O pieces a state file is written and read in.
inline constexpr uint64_t kSavedChunkPieceBytes = uint64_t{8} << 20;

struct FreeBytes {
  void operator()(std::byte* p) const { std::free(p); }
};
// A chunk's state buffer of `bytes`, 4 KiB-aligned, its pages faulted in.
using StateBuffer = std::unique_ptr<std::byte[], FreeBytes>;
StateBuffer AllocateStateBuffer(uint64_t bytes);

// A chunk's state as its file holds it in the memory of a StateArena, given
// back with the object. Move-only.
class ArenaState {
 public:
  ArenaState() = default;
  // shape.bytes() of the arena; RESOURCE_EXHAUSTED when it cannot have them.
  static absl::StatusOr<ArenaState> Take(StateArena* arena, StateShape shape);
  ArenaState(ArenaState&& other) noexcept { *this = std::move(other); }
  ArenaState& operator=(ArenaState&& other) noexcept;
  ~ArenaState() { Reset(); }

  bool empty() const { return arena_ == nullptr; }
  std::byte* data() const { return data_; }
  StateView view() const { return shape_.ViewOf(data_); }
  // Copies the state `view` (of the same shape) in.
  void CopyFrom(const StateView& view);
  // Gives the memory back; empty() after.
  void Reset();

 private:
  StateArena* arena_ = nullptr;
  std::byte* data_ = nullptr;
  StateShape shape_;
};

// Writes the `bytes` of a state to `file` and syncs it; returns the
// checksum. Direct I/O when the memory is 4
// KiB-aligned and the file system has it, buffered otherwise. The I/O error
// naming the file on failure.
absl::StatusOr<uint64_t> SaveChunkState(const RootedPath& file, const std::byte* state,
                                        uint64_t bytes);
// The checksum SaveChunkState() would return for the same state, without
// writing it (a replica's state compared with its primary's file).
uint64_t ChecksumChunkState(const std::byte* state, uint64_t bytes);
// SaveChunkState() to `file`, or ChecksumChunkState() when `file` is empty.
absl::StatusOr<uint64_t> SaveOrChecksumChunkState(const RootedPath& file, const std::byte* state,
                                                  uint64_t bytes);
// Reads the `bytes` of a state from `file` into `state`, verifying the checksum as
// the pieces arrive: DATA_LOSS naming the file when it is missing or its size
// or checksum is not the recorded one. Direct I/O in large pieces kept in
// flight when `state` is 4 KiB-aligned (AllocateStateBuffer), buffered
// otherwise.
absl::Status LoadChunkState(const RootedPath& file, uint64_t checksum, uint64_t bytes,
                            std::byte* state);

// Small files beside a saved state (a chunk's copy of the step before):
// `bytes` written to `path` and synced; returns their XXH3.
absl::StatusOr<uint64_t> SaveBytes(const std::string& path, absl::string_view bytes);
// The `size` bytes of `path`: DATA_LOSS naming the file when it is missing
// or its size or checksum is not the recorded one.
absl::StatusOr<std::string> LoadBytes(const std::string& path, uint64_t checksum, size_t size);

}  // namespace strata

#endif  // STRATA_SHARD_SAVED_CHUNK_H_
