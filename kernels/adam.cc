#include "kernels/adam.h"

#include <cmath>

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
  c.inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  if (config.adamw) {
    c.decay = 1.0f - config.lr * config.weight_decay;
  } else {
    c.l2 = config.weight_decay;
  }
  c.coef = coef;
  return c;
}

}  // namespace strata
