#include "storage/free_ranges.h"

#include <iterator>

namespace strata {

void FreeRanges::Insert(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
  free_bytes_ += size;
}

std::map<uint64_t, uint64_t>::iterator FreeRanges::Erase(
    std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  return by_offset_.erase(it);
}

void FreeRanges::Give(uint64_t offset, uint64_t size) {
  if (size == 0) return;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + size) {
    size += next->second;
    next = Erase(next);
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      Erase(prev);
    }
  }
  Insert(offset, size);
}

std::optional<uint64_t> FreeRanges::TakeBestFit(uint64_t size) {
  auto best = by_size_.lower_bound({size, 0});
  if (best == by_size_.end()) return std::nullopt;
  const auto [range_bytes, offset] = *best;
  Erase(by_offset_.find(offset));
  if (range_bytes > size) Insert(offset + size, range_bytes - size);
  return offset;
}

bool FreeRanges::TakeAt(uint64_t offset, uint64_t size) {
  if (offset + size < offset) return false;  // past the end of any space
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin() || std::prev(it)->first + std::prev(it)->second < offset + size) {
    return false;
  }
  --it;
  const uint64_t free_begin = it->first, free_size = it->second;
  Erase(it);
  if (offset > free_begin) Insert(free_begin, offset - free_begin);
  if (free_begin + free_size > offset + size) {
    Insert(offset + size, free_begin + free_size - offset - size);
  }
  return true;
}

uint64_t FreeRanges::largest_range_bytes() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace strata
