// ScalarOps: the Ops interface with a vector of one float. It is the scalar
// variant, and every SIMD variant uses it for the tail of a buffer, so a
// tail element gets exactly the bits a vector lane would.
//
// The Ops interface: kWidth; F (kWidth floats); Set, Add, Sub, Mul, Div,
// Sqrt (IEEE, correctly rounded, never fused unless asked) and Fma (fused,
// correctly rounded: a * b + c with one rounding); AllFinite(x) (no lane is
// Inf or NaN); LoadF32/F16/Bf16; LoadBf16Pairs(p, even, odd), which loads
// 2 kWidth BF16 values and returns those at even offsets in `even` and the
// others in `odd`; StoreF32/F16/Bf16<kStream> (round to nearest even); Fence() after streaming
// stores; for the sum of squares, kDoubleWidth and D (a vector of that many
// doubles), LoadD, StoreD, AddD, MulD and ToDoubles(x, out), which widens
// the kWidth floats of x into kWidth / kDoubleWidth vectors of doubles.
//
// Defined in an anonymous namespace on purpose: each variant's translation
// unit gets its own copy, compiled for its own instruction set.
#ifndef STRATA_KERNELS_CPU_SCALAR_OPS_H_
#define STRATA_KERNELS_CPU_SCALAR_OPS_H_

#include <cmath>

#include "kernels/cpu/ops_common.h"
#include "kernels/half.h"

namespace strata {
namespace kernels_internal {
namespace {

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
  static F LoadF32(const float* p) { return *p; }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static F LoadBf16(const uint16_t* p) { return Bf16ToFloat(*p); }
  static void LoadBf16Pairs(const uint16_t* p, F* even, F* odd) {
    *even = Bf16ToFloat(p[0]);
    *odd = Bf16ToFloat(p[1]);
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
};

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_SCALAR_OPS_H_
