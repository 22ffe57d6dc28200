// Gradient statistics in one pass: the sum of squares (accumulated in double,
// so that a billion elements lose nothing to the count; FP16 squares, and BF16
// squares where exact, are first summed 16 at a time in FP32: relative error
// <= 15 * 2^-24) and whether every element is finite. The same bits in every instruction-set
// variant. Pure function; thread-safe.
#ifndef STRATA_KERNELS_GRAD_STATS_H_
#define STRATA_KERNELS_GRAD_STATS_H_

#include <cstddef>

#include "strata/types.h"

namespace strata {

struct GradStats {
  double sum_squares = 0.0;  // over the finite elements
  bool all_finite = true;
};

GradStats ComputeGradStats(DType dtype, const void* grads, size_t n);

}  // namespace strata

#endif  // STRATA_KERNELS_GRAD_STATS_H_
