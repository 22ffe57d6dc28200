#include "kernels/elementwise.h"

#include "kernels/dtype_access.h"

namespace strata {

using kernels_internal::WithDType;

void CastFromFloat(const float* from, DType dtype, void* to, size_t n) {
  WithDType(dtype, [&](auto policy) {
    using P = decltype(policy);
    auto* out = static_cast<typename P::Storage*>(to);
    for (size_t i = 0; i < n; ++i) P::Store(out, i, from[i]);
  });
}

void CastToFloat(DType dtype, const void* from, float* to, size_t n) {
  WithDType(dtype, [&](auto policy) {
    using P = decltype(policy);
    const auto* in = static_cast<const typename P::Storage*>(from);
    for (size_t i = 0; i < n; ++i) to[i] = P::Load(in, i);
  });
}

void AccumulateScaled(DType dtype, const float* x, float scale, void* acc, size_t n) {
  WithDType(dtype, [&](auto policy) {
    using P = decltype(policy);
    auto* out = static_cast<typename P::Storage*>(acc);
    for (size_t i = 0; i < n; ++i) P::Store(out, i, P::Load(out, i) + scale * x[i]);
  });
}

void AddInPlace(DType dtype, const void* x, void* acc, size_t n) {
  WithDType(dtype, [&](auto policy) {
    using P = decltype(policy);
    const auto* in = static_cast<const typename P::Storage*>(x);
    auto* out = static_cast<typename P::Storage*>(acc);
    for (size_t i = 0; i < n; ++i) P::Store(out, i, P::Load(out, i) + P::Load(in, i));
  });
}

}  // namespace strata
