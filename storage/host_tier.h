// HostTier: chunk extents in host memory, zeroed and faulted in, aligned to
// 4 KiB from kPageAlignedFromBytes (64 KiB) on (pinned for the GPU: all) and
// to 64 bytes below, within a byte budget, optionally page-locked so that
// they are never swapped out: with mlock, or registered with CUDA
// (cudaHostRegister, storage/gpu_tier.h) so that the GPUs copy to and from
// them by DMA. A page-aligned extent to fill (AllocateToFill) is faulted in
// by the writes that fill it and pinned by Settle.
//
// Kept memory: a freed page-aligned extent's memory is kept, faulted in and
// pinned, and so is memory faulted in ahead by Prefault (for the GPU,
// registered only as extents take it). A new page-aligned extent takes a
// kept block of its size, else the front of a larger one (zeroed unless
// never written: far cheaper than faulting memory in and pinning it
// again); blocks registered with CUDA are taken whole only.
// Kept memory counts against the budget with the extents and is released
// (as much as is needed, the largest blocks first) when a new extent needs
// the room, when the system refuses one (memory, the memlock limit), and
// with the tier.
//
// Thread-safe; an extent is made, settled and freed outside the lock that
// reads and writes of the others take. Reads and writes are memcpy and
// complete inline.
#ifndef STRATA_STORAGE_HOST_TIER_H_
#define STRATA_STORAGE_HOST_TIER_H_

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "storage/tier.h"

namespace strata {

class HostTier : public Tier {
 public:
  static constexpr uint64_t kPageAlignedFromBytes = uint64_t{64} << 10;

  enum class Pinning { kNone, kMlock, kGpu };
  // Pinned, Allocate() page-locks each extent and fails with
  // RESOURCE_EXHAUSTED, naming the memlock limit, when that is refused.
  explicit HostTier(uint64_t budget_bytes, Pinning pinning = Pinning::kNone);
  ~HostTier() override;
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  TierKind kind() const override { return TierKind::kHost; }
  uint64_t budget_bytes() const override { return budget_bytes_; }
  uint64_t used_bytes() const override;
  uint64_t kept_bytes() const override;
  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override;
  absl::StatusOr<Extent> AllocateToFill(uint64_t num_bytes) override;
  // Faults in `num_bytes` (rounded up to 4 KiB) of the budget now and keeps
  // them for extents to come, pinned as pinning says (for the GPU, each
  // extent's part is registered as the extent takes it). RESOURCE_EXHAUSTED
  // beyond the budget (counting what the tier holds and keeps) or when the
  // system refuses the memory or its page-lock.
  absl::Status Prefault(uint64_t num_bytes);
  // Pins as pinning says (mlock faults in the pages the writes left out;
  // unpinned, such a page is faulted in, zeroed, when first touched);
  // RESOURCE_EXHAUSTED naming the memlock limit when that is refused;
  // NOT_FOUND for an extent the tier does not hold.
  absl::Status Settle(const Extent& extent) override;
  void Free(const Extent& extent) override;
  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override;
  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override;
  std::byte* Map(const Extent& extent) override;

 private:
  struct Block {
    std::byte* data = nullptr;
    uint64_t num_bytes = 0;  // as reserved from the budget
    bool mapped = false;     // mmap()ed (page-aligned), else aligned_alloc()ed
    bool settled = false;    // faulted in and pinned as pinning_ says
    bool zeroed = false;     // never written since the kernel faulted it in (kept only)
  };
  absl::StatusOr<Extent> AllocateBlock(uint64_t num_bytes, bool to_fill);
  // OUT_OF_RANGE unless [offset, offset + num_bytes) lies in `extent`.
  absl::StatusOr<std::byte*> Locate(const Extent& extent, uint64_t offset, uint64_t num_bytes);

  // A new block of `num_bytes` (a multiple of `alignment`: 4096 or 64),
  // zeroed, its pages faulted in, and pinned as pinning_ says, or with
  // `to_fill` and page-aligned, mapped only (not settled); the error names
  // the cause. Takes no lock.
  absl::StatusOr<Block> NewBlock(uint64_t num_bytes, uint64_t alignment, bool to_fill);
  // A kept block of `rounded` bytes, taken out of kept_ (whole, or the
  // front of a larger one), or none; without one, takes the kept memory
  // that a new block of `rounded` bytes needs the room of into `released`
  // (for the caller to release outside the lock).
  std::optional<Block> TakeKept(uint64_t rounded, uint64_t alignment, std::vector<Block>* released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a kept block may be cut in two: not when CUDA registered it
  // whole.
  bool Divisible(const Block& block) const { return pinning_ != Pinning::kGpu || !block.settled; }
  // `block` cut after its first `front_bytes` (page-aligned, at most its
  // size): the front and the back.
  static std::pair<Block, Block> Cut(const Block& block, uint64_t front_bytes);
  // A kept block taken for an extent, zeroed and pinned for it (unless
  // `to_fill`, which Settle pins); takes no lock.
  absl::StatusOr<Block> Reuse(Block block, bool to_fill);
  // Releases every kept block; whether there was one.
  bool ReleaseKept() ABSL_LOCKS_EXCLUDED(mu_);
  // Page-locks a block as pinning_ says; RESOURCE_EXHAUSTED naming the
  // memlock limit when that is refused.
  absl::Status Pin(void* block, uint64_t num_bytes);
  // Unpins and frees `block`; FreeMemory only frees it.
  void Release(const Block& block);
  void FreeMemory(const Block& block);

  const uint64_t budget_bytes_;
  const Pinning pinning_;
  mutable absl::Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Block> blocks_ ABSL_GUARDED_BY(mu_);
  // Kept page-aligned blocks by size: freed settled ones and prefaulted
  // memory; used_bytes_ + kept_bytes_ never exceeds the budget.
  std::multimap<uint64_t, Block> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_STORAGE_HOST_TIER_H_
