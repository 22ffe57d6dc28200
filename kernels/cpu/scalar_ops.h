// ScalarOps: the Ops interface with a vector of one float. It is the scalar
// variant, and every SIMD variant uses it for the tail of a buffer, so a
// tail element gets exactly the bits a vector lane would.
//
// The Ops interface: kWidth; F (kWidth floats); Set, Add, Sub, Mul, Div,
// Sqrt (IEEE, correctly rounded, never fused unless asked) and Fma (fused,
// correctly rounded: a * b + c with one rounding); AllFinite(x) (no lane is
// Inf or NaN); LoadF32/F16/Bf16 (at any address); LoadBf16Pairs(p, even, odd), which loads
// 2 kWidth BF16 values and returns those at even offsets in `even` and the
// others in `odd`; StoreF32/F16/Bf16<kStream> (round to nearest even); Fence() after streaming
// stores; for the sum of squares, kDoubleWidth and D (a vector of that many
// doubles), LoadD, StoreD, AddD, MulD and ToDoubles(x, out), which widens
// the kWidth floats of x into kWidth / kDoubleWidth vectors of doubles.
// For the 8-bit state codes (int8_codes.h): I (kWidth uint32 lanes), SetI,
// AddI, SubI, MulI (low 32 bits), AndI, OrI, XorI, IotaI() (lanes 0, 1, ...),
// ShiftRightI<k> (logical), ShiftLeftI<k>, MinI (unsigned), Bits(x) and
// FromBits(i) (reinterpretations), ToFloat(i) (of lanes below 2^31),
// SelectLess(a, b, x, y) (a < b ? x : y, ordered float compare),
// SelectLessI(a, b, x, y) (the same for lanes below 2^31), MaxMagnitude(a,
// x) (the larger of a >= 0 and |x|, for finite lanes), ReduceMax(x) (the
// largest lane), LoadU8 and StoreU8 (kWidth bytes, one a lane; lanes below
// 256).
//
// Defined in an anonymous namespace on purpose: each variant's translation
// unit gets its own copy, compiled for its own instruction set.
#ifndef STRATA_KERNELS_CPU_SCALAR_OPS_H_
#define STRATA_KERNELS_CPU_SCALAR_OPS_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/ops_common.h"
#include "kernels/half.h"

namespace strata {
namespace kernels_internal {
namespace {

// The T at `p`, wherever it lies.
template <typename T>
T Unaligned(const void* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

struct ScalarOps {
  static constexpr size_t kWidth = 1;
  using F = float;
  static F Set(float x) { return x; }
  static F Add(F a, F b) { return a + b; }
  static F Sub(F a, F b) { return a - b; }
  static F Mul(F a, F b) { return a * b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Fma(F a, F b, F c) { return std::fma(a, b, c); }
  static bool AllFinite(F x) { return std::isfinite(x); }
  // Loads need no alignment, as the SIMD variants' (gradients lie where
  // gRPC received them).
  static F LoadF32(const float* p) { return Unaligned<float>(p); }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(Unaligned<uint16_t>(p)); }
  static F LoadBf16(const uint16_t* p) { return Bf16ToFloat(Unaligned<uint16_t>(p)); }
  static void LoadBf16Pairs(const uint16_t* p, F* even, F* odd) {
    *even = LoadBf16(p);
    *odd = LoadBf16(p + 1);
  }
  template <bool kStream>
  static void StoreF32(float* p, F x) {
    *p = x;
  }
  template <bool kStream>
  static void StoreF16(uint16_t* p, F x) {
    *p = FloatToHalf(x);
  }
  template <bool kStream>
  static void StoreBf16(uint16_t* p, F x) {
    *p = FloatToBf16(x);
  }
  static void Fence() {}
  static constexpr size_t kDoubleWidth = 1;
  using D = double;
  static D LoadD(const double* p) { return *p; }
  static void StoreD(double* p, D x) { *p = x; }
  static D AddD(D a, D b) { return a + b; }
  static D MulD(D a, D b) { return a * b; }
  static void ToDoubles(F x, D* out) { out[0] = x; }
  using I = uint32_t;
  static I SetI(uint32_t x) { return x; }
  static I AddI(I a, I b) { return a + b; }
  static I SubI(I a, I b) { return a - b; }
  static I MulI(I a, I b) { return a * b; }
  static I IotaI() { return 0; }
  static I AndI(I a, I b) { return a & b; }
  static I OrI(I a, I b) { return a | b; }
  static I XorI(I a, I b) { return a ^ b; }
  template <int k>
  static I ShiftRightI(I a) {
    return a >> k;
  }
  template <int k>
  static I ShiftLeftI(I a) {
    return a << k;
  }
  static I MinI(I a, I b) { return a < b ? a : b; }
  static I Bits(F x) { return FloatBits(x); }
  static F FromBits(I x) { return BitsToFloat(x); }
  static F ToFloat(I x) { return static_cast<float>(static_cast<int32_t>(x)); }
  static I SelectLess(F a, F b, I x, I y) { return a < b ? x : y; }
  static I SelectLessI(I a, I b, I x, I y) { return a < b ? x : y; }
  static F MaxMagnitude(F a, F x) { return a > std::fabs(x) ? a : std::fabs(x); }
  static float ReduceMax(F x) { return x; }
  static I LoadU8(const uint8_t* p) { return *p; }
  static void StoreU8(uint8_t* p, I x) { *p = static_cast<uint8_t>(x); }
};

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_SCALAR_OPS_H_
