// FreeRanges: the free byte ranges of a space (a file, a memory region),
// handed out first fit and merged with their free neighbours when given
// back. Not thread-safe: its owner serializes calls.
#ifndef STRATA_STORAGE_FREE_RANGES_H_
#define STRATA_STORAGE_FREE_RANGES_H_

#include <cstdint>
#include <map>
#include <optional>

namespace strata {

class FreeRanges {
 public:
  // Makes [offset, offset + size) free; it must not overlap a free range.
  void Give(uint64_t offset, uint64_t size);
  // The offset of `size` bytes cut from the lowest free range that holds
  // them; nullopt when none does.
  std::optional<uint64_t> TakeFirstFit(uint64_t size);
  // Takes [offset, offset + size); false (and nothing taken) unless all of
  // it is free (a range that wraps past 2^64 never is).
  bool TakeAt(uint64_t offset, uint64_t size);

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, never two adjacent
};

}  // namespace strata

#endif  // STRATA_STORAGE_FREE_RANGES_H_
