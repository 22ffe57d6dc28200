// Gradient statistics in one pass: the sum of squares and whether every
// element is finite. Squares are summed 8 at a time in FP32 (exact squares
// for FP16 and, unless they overflow or underflow FP32, BF16; FP32 squares
// round once), and those partial sums in double, so that a billion elements
// lose nothing to the count: relative error at most 8 * 2^-24. A block of 256
// elements with an Inf, a NaN or a square beyond FP32 is summed square by
// square in double, and so is a whole buffer whose sum is below 2^-80 (its
// squares may be too small for FP32; an all-zero buffer takes this second
// pass too). The same bits in every instruction-set variant. Pure function;
// thread-safe.
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
