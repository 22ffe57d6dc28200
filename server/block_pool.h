// BlockPool: host memory for copies of chunk states, in blocks of
// kBlockBytes (8 MiB, 4 KiB-aligned for direct I/O). The first
// `retained_bytes` of blocks are allocated and faulted in when the pool is
// made, and every Take() reuses them; blocks taken beyond them are allocated
// (and faulted in) when taken, the last one only as long as the bytes asked
// for need (rounded up to 4 KiB: a chunk of a few KiB does not fault in 8
// MiB), and freed when given back. So a checkpoint never waits for a block,
// and what the server keeps between saves is bounded.
//
// Why keep blocks at all: faulting memory in costs more than filling it. On
// a 2-vCPU VM, first touch ran at 1-1.5 GB/s against ~7 GB/s for a memcpy
// into touched memory, and a save whose copies were fresh spent half its
// CPU in clear_page (and as much of the training's, which shares the cores).
//
// Thread-safe.
#ifndef STRATA_SERVER_BLOCK_POOL_H_
#define STRATA_SERVER_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace strata {

// `bytes` (a multiple of 4 KiB) of memory aligned to 4 KiB, its pages
// faulted in (a copy into fresh memory spends most of its time in page
// faults); free() it. nullptr when the system refuses.
std::byte* AllocateFaultedIn(size_t bytes);

class BlockPool {
 public:
  static constexpr size_t kBlockBytes = size_t{8} << 20;

  // Keeps `retained_bytes` rounded down to whole blocks (fewer if the system
  // refuses memory; the others are then allocated when taken).
  explicit BlockPool(uint64_t retained_bytes);
  // Every block taken must have been given back.
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Blocks for `bytes`: block k holds bytes [k, k + 1) * kBlockBytes of
  // them. Kept blocks come first; a block allocated for the last piece is
  // only as long as the piece, rounded up to 4 KiB. Their contents are
  // undefined. RESOURCE_EXHAUSTED when the system refuses memory.
  absl::StatusOr<std::vector<std::byte*>> Take(uint64_t bytes);
  // Returns the blocks Take(bytes) gave: kept ones are kept, others freed.
  void Give(absl::Span<std::byte* const> blocks, uint64_t bytes);

  uint64_t retained_bytes() const { return kept_.size() * kBlockBytes; }
  // The most bytes out at once, and those allocated beyond the kept blocks,
  // since the pool was made: what --checkpoint_buffer_mib could be.
  uint64_t peak_taken_bytes() const;
  uint64_t allocated_beyond_bytes() const;

 private:
  // Up to `count` blocks, as many as the system gives.
  static std::vector<std::byte*> AllocateBlocks(size_t count);
  // The bytes of the blocks for `bytes` of which the first `kept` are kept.
  static uint64_t HeldBytes(uint64_t bytes, size_t kept);

  const std::vector<std::byte*> kept_;  // the retained blocks
  mutable absl::Mutex mu_;
  std::vector<std::byte*> free_ ABSL_GUARDED_BY(mu_);  // retained blocks not taken
  uint64_t taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_taken_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_beyond_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_SERVER_BLOCK_POOL_H_
