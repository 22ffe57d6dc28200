// Load and store one element of a DType buffer as float. Internal to kernels/.
#ifndef STRATA_KERNELS_DTYPE_ACCESS_H_
#define STRATA_KERNELS_DTYPE_ACCESS_H_

#include <cstdint>

#include "kernels/half.h"
#include "strata/types.h"

namespace strata {
namespace kernels_internal {

// Element access policies; kernels are templates over them so the dtype switch
// happens once per call, not once per element.
struct Fp16 {
  using Storage = uint16_t;
  static float Load(const Storage* p, size_t i) { return HalfToFloat(p[i]); }
  static void Store(Storage* p, size_t i, float x) { p[i] = FloatToHalf(x); }
};
struct Bf16 {
  using Storage = uint16_t;
  static float Load(const Storage* p, size_t i) { return Bf16ToFloat(p[i]); }
  static void Store(Storage* p, size_t i, float x) { p[i] = FloatToBf16(x); }
};
struct Fp32 {
  using Storage = float;
  static float Load(const Storage* p, size_t i) { return p[i]; }
  static void Store(Storage* p, size_t i, float x) { p[i] = x; }
};

// Calls fn(Policy{}) with the policy of `dtype`.
template <typename Fn>
void WithDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFp16:
      fn(Fp16{});
      return;
    case DType::kBf16:
      fn(Bf16{});
      return;
    case DType::kFp32:
      fn(Fp32{});
      return;
  }
}

}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_DTYPE_ACCESS_H_
