#include "storage/free_ranges.h"

#include <iterator>

namespace strata {

void FreeRanges::Give(uint64_t offset, uint64_t size) {
  if (size == 0) return;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

std::optional<uint64_t> FreeRanges::TakeFirstFit(uint64_t size) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t left = it->second - size;
    free_.erase(it);
    if (left > 0) free_[offset + size] = left;
    return offset;
  }
  return std::nullopt;
}

bool FreeRanges::TakeAt(uint64_t offset, uint64_t size) {
  if (offset + size < offset) return false;  // past the end of any space
  auto it = free_.upper_bound(offset);
  if (it == free_.begin() || std::prev(it)->first + std::prev(it)->second < offset + size) {
    return false;
  }
  --it;
  const uint64_t free_begin = it->first, free_size = it->second;
  free_.erase(it);
  if (offset > free_begin) free_[free_begin] = offset - free_begin;
  if (free_begin + free_size > offset + size) {
    free_[offset + size] = free_begin + free_size - offset - size;
  }
  return true;
}

}  // namespace strata
