#include "kernels/grad_stats.h"

#include <cmath>

#include "kernels/dtype_access.h"

namespace strata {

GradStats ComputeGradStats(DType dtype, const void* grads, size_t n) {
  GradStats stats;
  kernels_internal::WithDType(dtype, [&](auto policy) {
    using P = decltype(policy);
    const auto* in = static_cast<const typename P::Storage*>(grads);
    double sum = 0.0;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      double x = P::Load(in, i);
      if (std::isfinite(x)) {
        sum += x * x;
      } else {
        finite = false;
      }
    }
    stats.sum_squares = sum;
    stats.all_finite = finite;
  });
  return stats;
}

}  // namespace strata
