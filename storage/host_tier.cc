#include "storage/host_tier.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/memory_pages.h"
#include "core/round_up.h"
#include "core/status_macros.h"
#include "storage/gpu_tier.h"

namespace strata {

HostTier::HostTier(uint64_t budget_bytes, Pinning pinning)
    : budget_bytes_(budget_bytes), pinning_(pinning) {}

HostTier::~HostTier() {
  for (auto& [id, block] : blocks_) Release(block);
  ReleaseKept();
}

void HostTier::Release(const Block& block) {
  const bool pinned = block.settled && block.num_bytes > 0;
  if (pinned && pinning_ == Pinning::kMlock) munlock(block.data, block.num_bytes);
  if (pinned && pinning_ == Pinning::kGpu) UnpinForGpu(block.data);
  FreeMemory(block);
}

void HostTier::FreeMemory(const Block& block) {
  if (block.mapped) {
    munmap(block.data, block.num_bytes);
  } else {
    std::free(block.data);
  }
}

uint64_t HostTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t HostTier::kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

absl::StatusOr<HostTier::Block> HostTier::NewBlock(uint64_t num_bytes, uint64_t alignment,
                                                   bool to_fill) {
  Block block{nullptr, num_bytes, /*mapped=*/alignment == 4096 && num_bytes > 0};
  block.settled = !(to_fill && block.mapped);
  if (block.mapped) {
    // Zero pages, 2 MiB ones where the kernel has them, that the kernel
    // faults in now, so that no step touches a page first, with no pass of
    // our own over them; or, to fill, as the writes touch them.
    void* mapped =
        mmap(nullptr, num_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped != MAP_FAILED) {
      block.data = static_cast<std::byte*>(mapped);
      AdviseHugePages(mapped, num_bytes);
      if (block.settled) FaultInPages(mapped, num_bytes);
    }
  } else {
    void* allocated = std::aligned_alloc(alignment, num_bytes == 0 ? alignment : num_bytes);
    if (allocated != nullptr) {
      block.data = static_cast<std::byte*>(std::memset(allocated, 0, num_bytes));
    }
  }
  if (block.data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host tier: the system refused ", num_bytes, " bytes"));
  }
  if (block.settled && num_bytes > 0) {
    absl::Status pinned = Pin(block.data, num_bytes);
    if (!pinned.ok()) {
      FreeMemory(block);
      return pinned;
    }
  }
  return block;
}

absl::StatusOr<Extent> HostTier::Allocate(uint64_t num_bytes) {
  return AllocateBlock(num_bytes, /*to_fill=*/false);
}

absl::StatusOr<Extent> HostTier::AllocateToFill(uint64_t num_bytes) {
  return AllocateBlock(num_bytes, /*to_fill=*/true);
}

absl::StatusOr<Extent> HostTier::AllocateBlock(uint64_t num_bytes, bool to_fill) {
  // Large extents 4 KiB-aligned: direct I/O writes checkpoints straight from
  // chunk states; small ones 64 bytes, so that tiny chunks do not take pages,
  // unless registered with CUDA, which refuses two registrations of a page.
  const uint64_t alignment =
      num_bytes >= kPageAlignedFromBytes || pinning_ == Pinning::kGpu ? 4096 : 64;
  uint64_t rounded = 0;
  std::optional<Block> kept;
  std::vector<Block> released;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(
        rounded, RoundUpInBudget("host tier", num_bytes, alignment, used_bytes_, budget_bytes_));
    used_bytes_ += rounded;  // reserved while the block is made
    kept = TakeKept(rounded, alignment, &released);
  }
  // Made (or zeroed) and pinned outside the lock: the tier's other extents
  // stay readable and writable meanwhile.
  for (const Block& b : released) Release(b);
  absl::StatusOr<Block> block =
      kept.has_value() ? Reuse(*kept, to_fill) : NewBlock(rounded, alignment, to_fill);
  // The system's refusal (of memory, or of the memlock limit) may be the
  // kept memory's doing.
  if (!block.ok() && ReleaseKept()) block = NewBlock(rounded, alignment, to_fill);
  absl::MutexLock lock(&mu_);
  if (!block.ok()) {
    used_bytes_ -= rounded;
    return block.status();
  }
  Extent extent{next_id_++, 0, num_bytes};
  blocks_.emplace(extent.id, *block);
  return extent;
}

absl::StatusOr<HostTier::Block> HostTier::Reuse(Block block, bool to_fill) {
  if (!block.zeroed) std::memset(block.data, 0, block.num_bytes);
  block.zeroed = false;
  if (!block.settled && !to_fill) {
    if (absl::Status pinned = Pin(block.data, block.num_bytes); !pinned.ok()) {
      FreeMemory(block);
      return pinned;
    }
    block.settled = true;
  }
  return block;
}

absl::Status HostTier::Prefault(uint64_t num_bytes) {
  if (num_bytes == 0) return absl::OkStatus();
  uint64_t rounded = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(rounded, RoundUpInBudget("host tier", num_bytes, 4096,
                                              used_bytes_ + kept_bytes_, budget_bytes_));
    used_bytes_ += rounded;  // reserved while the block is made
  }
  // CUDA's registration is of whole blocks: for the GPU, each extent's part
  // is registered when the extent takes it.
  const bool whole_pinned = pinning_ != Pinning::kGpu;
  absl::StatusOr<Block> block = NewBlock(rounded, 4096, /*to_fill=*/!whole_pinned);
  if (block.ok() && !whole_pinned) FaultInPages(block->data, rounded);
  absl::MutexLock lock(&mu_);
  used_bytes_ -= rounded;
  RETURN_IF_ERROR(block.status());
  block->zeroed = true;
  kept_bytes_ += rounded;
  kept_.emplace(rounded, *block);
  return absl::OkStatus();
}

std::pair<HostTier::Block, HostTier::Block> HostTier::Cut(const Block& block,
                                                          uint64_t front_bytes) {
  Block front = block, back = block;
  front.num_bytes = front_bytes;
  back.data += front_bytes;
  back.num_bytes -= front_bytes;
  return {front, back};
}

std::optional<HostTier::Block> HostTier::TakeKept(uint64_t rounded, uint64_t alignment,
                                                  std::vector<Block>* released) {
  if (alignment == 4096) {
    auto it = kept_.find(rounded);
    if (it == kept_.end()) {  // else the smallest larger one that may be cut
      it = kept_.upper_bound(rounded);
      while (it != kept_.end() && !Divisible(it->second)) ++it;
    }
    if (it != kept_.end()) {
      auto [front, back] = Cut(it->second, rounded);
      kept_.erase(it);
      kept_bytes_ -= rounded;
      if (back.num_bytes > 0) kept_.emplace(back.num_bytes, back);
      return front;
    }
  }
  while (used_bytes_ + kept_bytes_ > budget_bytes_) {  // the largest first, what is needed of it
    auto largest = std::prev(kept_.end());
    Block block = largest->second;
    kept_.erase(largest);
    const uint64_t excess = used_bytes_ + kept_bytes_ - budget_bytes_;
    const uint64_t needed = RoundUp(excess, 4096);
    if (Divisible(block) && needed < block.num_bytes) {
      auto [front, back] = Cut(block, block.num_bytes - needed);
      kept_.emplace(front.num_bytes, front);
      block = back;
    }
    kept_bytes_ -= block.num_bytes;
    released->push_back(block);
  }
  return std::nullopt;
}

bool HostTier::ReleaseKept() {
  std::multimap<uint64_t, Block> released;
  {
    absl::MutexLock lock(&mu_);
    released.swap(kept_);
    kept_bytes_ = 0;
  }
  for (const auto& [bytes, block] : released) Release(block);
  return !released.empty();
}

absl::Status HostTier::Pin(void* block, uint64_t num_bytes) {
  absl::Status pinned;
  switch (pinning_) {
    case Pinning::kNone:
      break;
    case Pinning::kMlock:
      if (mlock(block, num_bytes) != 0) pinned = absl::ResourceExhaustedError(std::strerror(errno));
      break;
    case Pinning::kGpu:
      pinned = PinForGpu(block, num_bytes);
      break;
  }
  if (pinned.ok()) return pinned;
  return absl::ResourceExhaustedError(absl::StrCat(
      "host tier: cannot page-lock ", num_bytes, " bytes (", pinned.message(),
      "): raise the memlock limit (ulimit -l; in docker-compose, ulimits: memlock: -1) or "
      "grant CAP_IPC_LOCK, or run the server with --pin_host_memory=false"));
}

absl::Status HostTier::Settle(const Extent& extent) {
  Block block;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(extent.id);
    if (it == blocks_.end()) {
      return absl::NotFoundError(absl::StrCat("host tier: no extent ", extent.id));
    }
    if (it->second.settled) return absl::OkStatus();
    block = it->second;
  }
  RETURN_IF_ERROR(Pin(block.data, block.num_bytes));
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(extent.id);
  if (it != blocks_.end()) it->second.settled = true;
  return absl::OkStatus();
}

void HostTier::Free(const Extent& extent) {
  Block block;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(extent.id);
    if (it == blocks_.end()) return;
    block = it->second;
    blocks_.erase(it);
    if (block.mapped && block.settled) {  // kept for the extents to come
      used_bytes_ -= block.num_bytes;
      kept_bytes_ += block.num_bytes;
      kept_.emplace(block.num_bytes, block);
      return;
    }
  }
  Release(block);
  // The budget comes back once the memory has.
  absl::MutexLock lock(&mu_);
  used_bytes_ -= block.num_bytes;
}

absl::StatusOr<std::byte*> HostTier::Locate(const Extent& extent, uint64_t offset,
                                            uint64_t num_bytes) {
  RETURN_IF_ERROR(CheckRange("host tier", extent.id, extent.num_bytes, offset, num_bytes));
  std::byte* base = Map(extent);
  if (base == nullptr) {
    return absl::NotFoundError(absl::StrCat("host tier: no extent ", extent.id));
  }
  return base + offset;
}

void HostTier::Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) {
  absl::StatusOr<std::byte*> src = Locate(from, offset, to.size());
  if (src.ok()) std::memcpy(to.data(), *src, to.size());
  std::move(done)(src.status());
}

void HostTier::Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
                     IoDone done) {
  absl::StatusOr<std::byte*> dst = Locate(to, offset, from.size());
  if (dst.ok()) std::memcpy(*dst, from.data(), from.size());
  std::move(done)(dst.status());
}

std::byte* HostTier::Map(const Extent& extent) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(extent.id);
  return it == blocks_.end() ? nullptr : it->second.data;
}

}  // namespace strata
