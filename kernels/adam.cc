#include "kernels/adam.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace strata {
namespace {

// The decimal a float hyper-parameter was written as (0.999, not the float's
// exact 0.99900001287...): its shortest round-trip representation, in double.
double AsWritten(float x) {
  char buf[32];
  std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf) - 1, x);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

// torch.optim.Adam(W) takes its hyper-parameters as Python floats, combines
// them in double (1 - beta2, lr / bc1, 1 - lr * wd) and rounds each result to
// float once; so does this (1.0f - 0.999f would differ from float(0.001) by
// 1.3e-5 relative, which torch users would see as drift).
AdamConstants MakeAdamConstants(const AdamConfig& config, int64_t step, float coef) {
  const double beta1 = AsWritten(config.beta1), beta2 = AsWritten(config.beta2);
  const double lr = AsWritten(config.lr);
  AdamConstants c;
  c.beta1 = config.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = config.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = config.eps;
  double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  c.step_size = static_cast<float>(lr / bc1);
  c.inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  if (config.adamw) {
    c.decay = static_cast<float>(1.0 - lr * AsWritten(config.weight_decay));
  } else {
    c.l2 = config.weight_decay;
  }
  c.coef = coef;
  return c;
}

}  // namespace strata
