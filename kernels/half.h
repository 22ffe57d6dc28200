// Scalar conversions between FP32 and the 16-bit formats FP16 (IEEE binary16)
// and BF16. Float to 16-bit rounds to nearest even; FP16 overflow gives ±Inf;
// NaN stays NaN (quieted). Pure functions; thread-safe. The functions are
// `static` so that each kernel variant, compiled for its own instruction set,
// keeps its own copy (a shared inline copy could carry AVX-512 code into the
// scalar path).
#ifndef STRATA_KERNELS_HALF_H_
#define STRATA_KERNELS_HALF_H_

#include <cstdint>
#include <cstring>

namespace strata {

static inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

static inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

static inline float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);
  // Subnormal: normalize the mantissa.
  uint32_t shifts = 0;
  while ((mantissa & 0x400) == 0) {
    mantissa <<= 1;
    ++shifts;
  }
  return BitsToFloat(sign | ((113 - shifts) << 23) | ((mantissa & 0x3ff) << 13));
}

static inline uint16_t FloatToHalf(float f) {
  uint32_t bits = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t abs = bits & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00 | ((abs >> 13) & 0x3ff);  // NaN
  if (abs >= 0x47800000) return sign | 0x7c00;                         // >= 2^16: Inf
  if (abs >= 0x38800000) {                                             // normal half
    uint32_t h = (((abs >> 23) - 112) << 10) | ((abs & 0x7fffff) >> 13);
    uint32_t rest = abs & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into Inf
    return static_cast<uint16_t>(sign | h);
  }
  if (abs <= 0x33000000) return sign;  // <= 2^-25 rounds to zero
  // Subnormal half: units of 2^-24.
  uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
  uint32_t shift = 126 - (abs >> 23);
  uint32_t h = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

static inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(uint32_t{b} << 16); }

static inline uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

}  // namespace strata

#endif  // STRATA_KERNELS_HALF_H_
