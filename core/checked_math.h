// Overflow-checked arithmetic for sizes and counts that come from outside
// the process (requests, files): every product or sum of such values goes
// through these before it sizes an allocation, a copy or a loop. Stateless.
#ifndef STRATA_CORE_CHECKED_MATH_H_
#define STRATA_CORE_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

namespace strata {

// a + b, or nullopt when it does not fit 64 bits.
inline std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// a * b, or nullopt when it does not fit 64 bits.
inline std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

}  // namespace strata

#endif  // STRATA_CORE_CHECKED_MATH_H_
