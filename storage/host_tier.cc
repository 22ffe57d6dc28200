#include "storage/host_tier.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

HostTier::HostTier(uint64_t budget_bytes, bool pin_memory)
    : budget_bytes_(budget_bytes), pin_memory_(pin_memory) {}

HostTier::~HostTier() {
  for (auto& [id, block] : blocks_) Release(block);
}

void HostTier::Release(const Block& block) {
  if (pin_memory_) munlock(block.data, block.num_bytes);
  std::free(block.data);
}

uint64_t HostTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

absl::StatusOr<Extent> HostTier::Allocate(uint64_t num_bytes) {
  // Large extents 4 KiB-aligned: direct I/O writes checkpoints straight from
  // chunk states; small ones 64 bytes, so that tiny chunks do not take pages.
  const uint64_t alignment = num_bytes >= kPageAlignedFromBytes ? 4096 : 64;
  uint64_t rounded = (num_bytes + alignment - 1) / alignment * alignment;
  absl::MutexLock lock(&mu_);
  if (rounded > budget_bytes_ - used_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("host tier: ", num_bytes,
                                                     " bytes do not fit: ", used_bytes_, " of ",
                                                     budget_bytes_, " budget bytes in use"));
  }
  void* block = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (block == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host tier: the system refused ", rounded, " bytes"));
  }
  std::memset(block, 0, rounded);
  if (pin_memory_ && rounded > 0 && mlock(block, rounded) != 0) {
    int error = errno;
    std::free(block);
    return absl::ResourceExhaustedError(absl::StrCat(
        "host tier: cannot page-lock ", rounded, " bytes (", std::strerror(error),
        "): raise the memlock limit (ulimit -l; in docker-compose, ulimits: memlock: -1) or "
        "grant CAP_IPC_LOCK, or run the server with --pin_host_memory=false"));
  }
  Extent extent{next_id_++, 0, num_bytes};
  blocks_.emplace(extent.id, Block{static_cast<std::byte*>(block), rounded});
  used_bytes_ += rounded;
  return extent;
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
  if (offset > extent.num_bytes || num_bytes > extent.num_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("host tier: range [", offset, ", ",
                                              offset + num_bytes, ") is outside extent ", extent.id,
                                              " of ", extent.num_bytes, " bytes"));
  }
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
