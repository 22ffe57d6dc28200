// RoundUp: the smallest multiple of a granule (an alignment, a block, a
// page) at or above a size. For sizes already bounded well below 2^64 (by a
// budget, a layout or a checked product); stateless.
#ifndef STRATA_CORE_ROUND_UP_H_
#define STRATA_CORE_ROUND_UP_H_

#include <cstdint>

namespace strata {

// `n` rounded up to a multiple of `multiple` (> 0).
inline constexpr uint64_t RoundUp(uint64_t n, uint64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace strata

#endif  // STRATA_CORE_ROUND_UP_H_
