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

absl::StatusOr<std::vector<std::byte*>> BlockPool::Take(size_t count) {
  std::vector<std::byte*> blocks;
  blocks.reserve(count);
  {
    absl::MutexLock lock(&mu_);
    const size_t kept = std::min(count, free_.size());
    blocks.assign(free_.end() - kept, free_.end());
    free_.resize(free_.size() - kept);
    taken_ += count;
    peak_taken_ = std::max(peak_taken_, taken_);
    allocated_beyond_ += count - kept;
  }
  // Outside the lock: faulting a block in takes milliseconds.
  while (blocks.size() < count) {
    std::byte* block = AllocateFaultedIn(kBlockBytes);
    if (block == nullptr) {
      const size_t missing = count - blocks.size();
      Give(blocks);
      absl::MutexLock lock(&mu_);
      taken_ -= missing;
      return absl::ResourceExhaustedError(
          absl::StrCat("the system refused ", count * kBlockBytes,
                       " bytes of host memory for a copy of a chunk's state"));
    }
    blocks.push_back(block);
  }
  return blocks;
}

void BlockPool::Give(absl::Span<std::byte* const> blocks) {
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
    taken_ -= blocks.size();
  }
  for (std::byte* block : to_free) std::free(block);
}

uint64_t BlockPool::peak_taken_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_taken_ * kBlockBytes;
}

uint64_t BlockPool::allocated_beyond_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_beyond_ * kBlockBytes;
}

}  // namespace strata
