#include "server/block_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

constexpr size_t kAlignment = 4096;

}  // namespace

std::byte* AllocateFaultedIn(size_t bytes) {
  void* memory = std::aligned_alloc(kAlignment, bytes);
  if (memory == nullptr) return nullptr;
  // MADV_POPULATE_WRITE is Linux 5.14's; older kernels refuse it, and then
  // each page is touched.
  if (madvise(memory, bytes, MADV_POPULATE_WRITE) != 0) {
    for (size_t i = 0; i < bytes; i += kAlignment) static_cast<volatile char*>(memory)[i] = 0;
  }
  return static_cast<std::byte*>(memory);
}

std::vector<std::byte*> BlockPool::AllocateBlocks(size_t count) {
  std::vector<std::byte*> blocks;
  for (size_t i = 0; i < count; ++i) {
    std::byte* block = AllocateFaultedIn(kBlockBytes);
    if (block == nullptr) break;
    blocks.push_back(block);
  }
  return blocks;
}

BlockPool::BlockPool(uint64_t retained_bytes)
    : kept_(AllocateBlocks(retained_bytes / kBlockBytes)), free_(kept_) {}

BlockPool::~BlockPool() {
  for (std::byte* block : kept_) std::free(block);
}

uint64_t BlockPool::HeldBytes(uint64_t bytes, size_t kept) {
  const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return std::max<uint64_t>(kept * kBlockBytes, rounded);
}

absl::StatusOr<std::vector<std::byte*>> BlockPool::Take(uint64_t bytes) {
  const size_t count = (bytes + kBlockBytes - 1) / kBlockBytes;
  std::vector<std::byte*> blocks;
  blocks.reserve(count);
  {
    absl::MutexLock lock(&mu_);
    const size_t kept = std::min(count, free_.size());
    blocks.assign(free_.end() - kept, free_.end());
    free_.resize(free_.size() - kept);
  }
  // Outside the lock: faulting a block in takes milliseconds.
  const size_t kept = blocks.size();
  while (blocks.size() < count) {
    const uint64_t at = blocks.size() * kBlockBytes;
    const uint64_t block_bytes = HeldBytes(std::min(bytes - at, uint64_t{kBlockBytes}), 0);
    std::byte* block = AllocateFaultedIn(block_bytes);
    if (block == nullptr) {
      for (size_t i = kept; i < blocks.size(); ++i) std::free(blocks[i]);
      absl::MutexLock lock(&mu_);
      free_.insert(free_.end(), blocks.begin(), blocks.begin() + kept);
      return absl::ResourceExhaustedError(absl::StrCat(
          "the system refused ", bytes, " bytes of host memory for a copy of a chunk's state"));
    }
    blocks.push_back(block);
  }
  absl::MutexLock lock(&mu_);
  taken_bytes_ += HeldBytes(bytes, kept);
  peak_taken_bytes_ = std::max(peak_taken_bytes_, taken_bytes_);
  allocated_beyond_bytes_ += HeldBytes(bytes, kept) - kept * kBlockBytes;
  return blocks;
}

void BlockPool::Give(absl::Span<std::byte* const> blocks, uint64_t bytes) {
  std::vector<std::byte*> to_free;
  {
    absl::MutexLock lock(&mu_);
    for (std::byte* block : blocks) {
      if (std::find(kept_.begin(), kept_.end(), block) != kept_.end()) {
        free_.push_back(block);
      } else {
        to_free.push_back(block);
      }
    }
    taken_bytes_ -= HeldBytes(bytes, blocks.size() - to_free.size());
  }
  for (std::byte* block : to_free) std::free(block);
}

uint64_t BlockPool::peak_taken_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_taken_bytes_;
}

uint64_t BlockPool::allocated_beyond_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_beyond_bytes_;
}

}  // namespace strata
