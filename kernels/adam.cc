#include "kernels/adam.h"

#include <cmath>

#include "kernels/dtype_access.h"

namespace strata {

AdamConstants MakeAdamConstants(const AdamConfig& config, int64_t step, float coef) {
  AdamConstants c;
  c.beta1 = config.beta1;
  c.one_minus_beta1 = 1.0f - config.beta1;
  c.beta2 = config.beta2;
  c.one_minus_beta2 = 1.0f - config.beta2;
  c.eps = config.eps;
  double bc1 = 1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step));
  double bc2 = 1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step));
  c.step_size = static_cast<float>(config.lr / bc1);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  if (config.adamw) {
    c.decay = 1.0f - config.lr * config.weight_decay;
  } else {
    c.l2 = config.weight_decay;
  }
  c.coef = coef;
  return c;
}

void AdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, float* p, float* m,
                float* v, DType copy_dtype, void* copy, size_t n) {
  using kernels_internal::WithDType;
  WithDType(grad_dtype, [&](auto grad_policy) {
    WithDType(copy_dtype, [&](auto copy_policy) {
      using G = decltype(grad_policy);
      using C = decltype(copy_policy);
      const auto* g_in = static_cast<const typename G::Storage*>(grads);
      auto* copy_out = static_cast<typename C::Storage*>(copy);
      for (size_t i = 0; i < n; ++i) {
        float g = c.coef * G::Load(g_in, i);
        float param = p[i];
        g = g + c.l2 * param;
        param = param * c.decay;
        float mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
        float vi = c.beta2 * v[i] + c.one_minus_beta2 * (g * g);
        float denom = std::sqrt(vi) / c.bias_correction2_sqrt + c.eps;
        param = param - c.step_size * (mi / denom);
        p[i] = param;
        m[i] = mi;
        v[i] = vi;
        C::Store(copy_out, i, param);
      }
    });
  });
}

}  // namespace strata
