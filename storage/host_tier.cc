#include "storage/host_tier.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "storage/gpu_tier.h"

namespace strata {

HostTier::HostTier(uint64_t budget_bytes, Pinning pinning)
    : budget_bytes_(budget_bytes), pinning_(pinning) {}

HostTier::~HostTier() {
  for (auto& [id, block] : blocks_) Release(block);
}

void HostTier::Release(const Block& block) {
  if (block.num_bytes > 0 && pinning_ == Pinning::kMlock) munlock(block.data, block.num_bytes);
  if (block.num_bytes > 0 && pinning_ == Pinning::kGpu) UnpinForGpu(block.data);
  std::free(block.data);
}

uint64_t HostTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

absl::StatusOr<Extent> HostTier::Allocate(uint64_t num_bytes) {
  // Large extents 4 KiB-aligned: direct I/O writes checkpoints straight from
  // chunk states; small ones 64 bytes, so that tiny chunks do not take pages,
  // unless registered with CUDA, which refuses two registrations of a page.
  const uint64_t alignment =
      num_bytes >= kPageAlignedFromBytes || pinning_ == Pinning::kGpu ? 4096 : 64;
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const uint64_t rounded,
                   RoundUpInBudget("host tier", num_bytes, alignment, used_bytes_, budget_bytes_));
  void* block = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (block == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host tier: the system refused ", rounded, " bytes"));
  }
  std::memset(block, 0, rounded);
  absl::Status pinned = rounded == 0 ? absl::OkStatus() : Pin(block, rounded);
  if (!pinned.ok()) {
    std::free(block);
    return absl::ResourceExhaustedError(absl::StrCat(
        "host tier: cannot page-lock ", rounded, " bytes (", pinned.message(),
        "): raise the memlock limit (ulimit -l; in docker-compose, ulimits: memlock: -1) or "
        "grant CAP_IPC_LOCK, or run the server with --pin_host_memory=false"));
  }
  Extent extent{next_id_++, 0, num_bytes};
  blocks_.emplace(extent.id, Block{static_cast<std::byte*>(block), rounded});
  used_bytes_ += rounded;
  return extent;
}

absl::Status HostTier::Pin(void* block, uint64_t num_bytes) {
  switch (pinning_) {
    case Pinning::kNone:
      return absl::OkStatus();
    case Pinning::kMlock:
      if (mlock(block, num_bytes) == 0) return absl::OkStatus();
      return absl::ResourceExhaustedError(std::strerror(errno));
    case Pinning::kGpu:
      return PinForGpu(block, num_bytes);
  }
  return absl::OkStatus();
}

void HostTier::Free(const Extent& extent) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(extent.id);
  if (it == blocks_.end()) return;
  used_bytes_ -= it->second.num_bytes;
  Release(it->second);
  blocks_.erase(it);
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
