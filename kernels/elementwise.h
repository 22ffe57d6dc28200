// Elementwise kernels on flat buffers whose element type is a DType:
// casts, accumulation and the in-place sum used by reduce-scatter.
// Pure functions over caller-owned memory: no threads, allocation or I/O.
#ifndef STRATA_KERNELS_ELEMENTWISE_H_
#define STRATA_KERNELS_ELEMENTWISE_H_

#include <cstddef>

#include "strata/types.h"

namespace strata {

// to[i] = round(from[i]) in `dtype`.
void CastFromFloat(const float* from, DType dtype, void* to, size_t n);
// to[i] = float(from[i]).
void CastToFloat(DType dtype, const void* from, float* to, size_t n);
// acc[i] = round(float(acc[i]) + scale * x[i]) in `dtype`.
void AccumulateScaled(DType dtype, const float* x, float scale, void* acc, size_t n);
// acc[i] = round(float(acc[i]) + float(x[i])) in `dtype`.
void AddInPlace(DType dtype, const void* x, void* acc, size_t n);

}  // namespace strata

#endif  // STRATA_KERNELS_ELEMENTWISE_H_
