// Pieces shared by every instruction-set variant of the CPU kernels, written
// against an "Ops" type that supplies a vector of kWidth floats and its
// operations (see scalar_ops.h for the interface).
//
// Everything here is instantiated with an Ops type that has internal linkage
// in its translation unit (each variant .cc compiles with its own ISA flags),
// so no instantiation compiled for AVX-512 can be shared with another variant.
#ifndef STRATA_KERNELS_CPU_OPS_COMMON_H_
#define STRATA_KERNELS_CPU_OPS_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "strata/types.h"

namespace strata {
namespace kernels_internal {

template <DType D>
struct DTypeTag {
  static constexpr DType value = D;
};

// Calls fn(DTypeTag<dtype>{}), so kernels are typed per dtype at compile time.
template <typename Fn>
inline void WithDTypeTag(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFp16:
      fn(DTypeTag<DType::kFp16>{});
      return;
    case DType::kBf16:
      fn(DTypeTag<DType::kBf16>{});
      return;
    case DType::kFp32:
      fn(DTypeTag<DType::kFp32>{});
      return;
  }
}

// Element i onwards of a buffer of dtype D, as a vector of floats.
template <typename Ops, DType D>
inline typename Ops::F LoadAs(const void* base, size_t i) {
  if constexpr (D == DType::kFp32) {
    return Ops::LoadF32(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kFp16) {
    return Ops::LoadF16(static_cast<const uint16_t*>(base) + i);
  } else {
    return Ops::LoadBf16(static_cast<const uint16_t*>(base) + i);
  }
}

// Stores x at element i of a buffer of dtype D, rounding to nearest even;
// kStream uses non-temporal stores (aligned addresses only).
template <typename Ops, DType D, bool kStream = false>
inline void StoreAs(void* base, size_t i, typename Ops::F x) {
  if constexpr (D == DType::kFp32) {
    Ops::template StoreF32<kStream>(static_cast<float*>(base) + i, x);
  } else if constexpr (D == DType::kFp16) {
    Ops::template StoreF16<kStream>(static_cast<uint16_t*>(base) + i, x);
  } else {
    Ops::template StoreBf16<kStream>(static_cast<uint16_t*>(base) + i, x);
  }
}

// The sum of squares keeps 64 double lanes: lane j accumulates elements
// 64 b + j in order, and the lanes are added in a fixed pairwise tree. Every
// variant fills the lanes the same way, so every variant gives the same bits;
// 64 lanes give a SIMD variant enough independent additions to keep up with
// memory.
inline constexpr size_t kSumLanes = 64;

static inline double ReduceLanes(const double* lanes) {
  double partial[kSumLanes];
  for (size_t j = 0; j < kSumLanes; ++j) partial[j] = lanes[j];
  for (size_t width = kSumLanes / 2; width > 0; width /= 2) {
    for (size_t j = 0; j < width; ++j) partial[j] = partial[2 * j] + partial[2 * j + 1];
  }
  return partial[0];
}

}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_OPS_COMMON_H_
