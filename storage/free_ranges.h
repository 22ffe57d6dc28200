// FreeRanges: the free byte ranges of a space (a file, a memory region),
// handed out best fit (the smallest free range that holds a request, the
// lowest of equals) and merged with their free neighbours when given back.
// Best fit keeps ranges freed by one size for that size and large ranges
// whole, where first fit cuts the first large range for every small
// request: with extents of mixed sizes (chunks and a job's shorter last
// chunk) first fit soon leaves no range for a large one though the free
// bytes would hold it. Not thread-safe: its owner serializes calls.
#ifndef STRATA_STORAGE_FREE_RANGES_H_
#define STRATA_STORAGE_FREE_RANGES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace strata {

class FreeRanges {
 public:
  // Makes [offset, offset + size) free; it must not overlap a free range.
  void Give(uint64_t offset, uint64_t size);
  // The offset of `size` bytes cut from the front of the smallest free
  // range that holds them (the lowest of equals); nullopt when none does.
  std::optional<uint64_t> TakeBestFit(uint64_t size);
  // Takes [offset, offset + size); false (and nothing taken) unless all of
  // it is free (a range that wraps past 2^64 never is).
  bool TakeAt(uint64_t offset, uint64_t size);

  uint64_t free_bytes() const { return free_bytes_; }
  // The largest request TakeBestFit() can satisfy now.
  uint64_t largest_range_bytes() const;

 private:
  void Insert(uint64_t offset, uint64_t size);
  std::map<uint64_t, uint64_t>::iterator Erase(std::map<uint64_t, uint64_t>::iterator it);

  std::map<uint64_t, uint64_t> by_offset_;           // offset -> bytes, never two adjacent
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (bytes, offset) of each range
  uint64_t free_bytes_ = 0;
};

}  // namespace strata

#endif  // STRATA_STORAGE_FREE_RANGES_H_
