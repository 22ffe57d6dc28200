// StateArena: host memory for the chunk states that checkpoints keep aside
// (a host-tier chunk's second state buffer, an NVMe-tier chunk's copy), in
// contiguous 4 KiB-aligned pieces (direct I/O writes them, kernels update
// them). The first `retained_bytes` are one region allocated and faulted in
// when the arena is made; Take() carves pieces from it (first fit, freed
// pieces coalesced). A piece that does not fit there is allocated (and
// faulted in) when taken, and kept when given back for a later Take() of
// its size: the first save of a big job faults its second buffers in, the
// next saves reuse them. All the arena holds (the region, pieces out and
// pieces kept) stays within `limit_bytes`; kept pieces are freed to make
// room before a Take() is refused. A chunk refused memory is written by the
// training step instead (Chunk::UpdateTarget), rather than the server
// running out of memory.
//
// Why keep memory at all: faulting memory in costs more than filling it. On
// a 2-vCPU VM, first touch ran at 1-1.5 GB/s against ~7 GB/s for a memcpy
// into touched memory, and a save whose buffers were fresh spent half its
// CPU in clear_page (and as much of the training's, which shares the cores).
//
// Thread-safe.
#ifndef STRATA_SERVER_STATE_ARENA_H_
#define STRATA_SERVER_STATE_ARENA_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Readies memory for takes of `piece_bytes`, all out at once, so that they
  // find it faulted in when they come (a job that checkpoints periodically,
  // at its allocation): the pieces that the region's free bytes and the kept
  // pieces cannot give are allocated now and kept, within the limit. Returns
  // the bytes allocated.
  uint64_t Prepare(const std::vector<uint64_t>& piece_bytes);

  uint64_t retained_bytes() const { return region_ != nullptr ? retained_bytes_ : 0; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  // The bytes out now, and all the arena holds (the region, pieces out and
  // pieces kept for later saves).
  uint64_t taken_bytes() const;
  uint64_t held_bytes() const;
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
    return std::max((bytes + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
  }

  const uint64_t retained_bytes_;
  const uint64_t limit_bytes_;
  std::byte* const region_;  // nullptr when nothing is retained
  mutable absl::Mutex mu_;
  FreeRanges free_ ABSL_GUARDED_BY(mu_);                  // of the region, by offset
  uint64_t region_taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the region, out now
  // Pieces allocated beyond the region and given back, by size.
  std::multimap<uint64_t, std::byte*> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t beyond_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // allocated beyond the region, out or kept
  uint64_t taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_beyond_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_SERVER_STATE_ARENA_H_
