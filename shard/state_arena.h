// StateArena: host memory for the chunk states that checkpoints keep aside
// (a host-tier chunk's second state buffer, an NVMe-tier chunk's copy), in
// contiguous 4 KiB-aligned pieces (direct I/O writes them, kernels update
// them). The first `retained_bytes` are one region allocated and faulted in
// when the arena is made; Take() carves pieces from it (best fit, freed
// pieces coalesced). A piece that does not fit there is allocated (and
// faulted in) when taken.
//
// The shard server reserves, for each job it holds, the pieces its saves
// take at once (a state per chunk in memory; Reserve/Unreserve), and faults
// in ahead, off the training's path, what the region cannot give
// (FaultInReserved): the arena keeps those pieces beyond the region between
// saves, so that no save faults memory in inside a training step. A piece
// beyond what the reservations need is freed when given back. All the arena
// holds (the region, pieces out and pieces kept) stays within
// `limit_bytes`; kept pieces are freed to make room before a Take() is
// refused. A chunk refused memory is written by the training step instead
// (Chunk::UpdateTarget), rather than the server running out of memory.
//
// Why keep memory at all: faulting memory in costs more than filling it. On
// a 2-vCPU VM, first touch ran at 1-1.5 GB/s against ~7 GB/s for a memcpy
// into touched memory, and a save whose buffers were fresh spent half its
// CPU in clear_page (and as much of the training's, which shares the cores);
// on a 16-core host, faulting in a 1.5 GiB job's buffers in its first save
// paused training for 30-70% of the save, against 0-9% with them faulted in
// ahead.
//
// Thread-safe.
#ifndef STRATA_SHARD_STATE_ARENA_H_
#define STRATA_SHARD_STATE_ARENA_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/round_up.h"
#include "storage/free_ranges.h"

namespace strata {

// `bytes` (a multiple of 4 KiB) of memory aligned to 4 KiB, its pages
// faulted in (a copy into fresh memory spends most of its time in page
// faults); free() it. nullptr when the system refuses.
std::byte* AllocateFaultedIn(size_t bytes);

class StateArena {
 public:
  static constexpr uint64_t kAlignment = 4096;

  // Keeps `retained_bytes` rounded down to 4 KiB (none if the system
  // refuses them; pieces are then allocated when taken); never holds more
  // than max(limit_bytes, the retained bytes).
  explicit StateArena(uint64_t retained_bytes, uint64_t limit_bytes = UINT64_MAX);
  // Every piece taken must have been given back; frees what it holds.
  ~StateArena();
  StateArena(const StateArena&) = delete;
  StateArena& operator=(const StateArena&) = delete;

  // `bytes` of contiguous memory, 4 KiB-aligned; contents undefined.
  // RESOURCE_EXHAUSTED when neither the region nor a kept piece has it and
  // a new piece would pass the limit, or the system refuses one.
  absl::StatusOr<std::byte*> Take(uint64_t bytes);
  // Returns what Take(bytes) gave.
  void Give(std::byte* piece, uint64_t bytes);

  // Adds takes of `piece_bytes`, all out at once, to those the arena keeps
  // memory for (a job's saves: one piece per chunk). Fast; nothing is
  // allocated until FaultInReserved().
  void Reserve(const std::vector<uint64_t>& piece_bytes);
  // Removes what Reserve(piece_bytes) added (a dropped job) and frees the
  // kept pieces no reservation needs any longer.
  void Unreserve(const std::vector<uint64_t>& piece_bytes);
  // Allocates, faults in and keeps the pieces that the reservations need
  // beyond the region and the pieces already held, within the limit.
  // Slow (first touch of every page).
  struct FaultedIn {
    uint64_t allocated_bytes = 0;
    // What the reservations still need for the limit (or the system
    // refusing memory): takes of those pieces will allocate, or be refused.
    uint64_t short_bytes = 0;
  };
  FaultedIn FaultInReserved();

  uint64_t retained_bytes() const { return region_ != nullptr ? retained_bytes_ : 0; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  // The bytes out now, and all the arena holds (the region, pieces out and
  // pieces kept for later saves).
  uint64_t taken_bytes() const;
  uint64_t held_bytes() const;
  // The bytes of the reserved pieces (all jobs' saves, at once).
  uint64_t reserved_bytes() const;
  // The most bytes out at once, and those allocated beyond the region, since
  // the arena was made: what --checkpoint_buffer_mib could be.
  uint64_t peak_taken_bytes() const;
  uint64_t allocated_beyond_bytes() const;
  // The bytes refused for the limit since the arena was made.
  uint64_t refused_bytes() const;

 private:
  void CountTaken(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a piece of `bytes` takes: whole 4 KiB pages, one at least.
  static uint64_t PieceBytes(uint64_t bytes) {
    return std::max(RoundUp(bytes, kAlignment), kAlignment);
  }
  // How many pieces of each size the reservations need beyond the region
  // (the region given to the smallest pieces first).
  std::map<uint64_t, uint64_t> NeededBeyond() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The count of pieces of `rounded` bytes in `pieces` (by size).
  static uint64_t CountOf(const std::map<uint64_t, uint64_t>& pieces, uint64_t rounded);
  // Whether a new piece of `rounded` bytes keeps all the arena holds within the limit.
  bool FitsLimit(uint64_t rounded) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a piece allocated (or being allocated) beyond the region.
  void CountBeyond(uint64_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets a piece allocated beyond the region (out or kept); the caller
  // frees it, outside the lock.
  void DropBeyond(uint64_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t retained_bytes_;
  const uint64_t limit_bytes_;
  std::byte* const region_;  // nullptr when nothing is retained
  mutable absl::Mutex mu_;
  FreeRanges free_ ABSL_GUARDED_BY(mu_);                  // of the region, by offset
  uint64_t region_taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the region, out now
  // Pieces allocated beyond the region and given back, by size.
  std::multimap<uint64_t, std::byte*> kept_ ABSL_GUARDED_BY(mu_);
  // Pieces allocated (or being allocated) beyond the region, out or kept:
  // their bytes, and their number by size.
  uint64_t beyond_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, uint64_t> beyond_pieces_ ABSL_GUARDED_BY(mu_);
  // Reserved pieces, by size, and their bytes.
  std::map<uint64_t, uint64_t> reserved_pieces_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_beyond_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_SHARD_STATE_ARENA_H_
