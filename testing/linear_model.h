// A linear least-squares model for elastic-training tests: sample i has
// features x_i (deterministic from i) and target y_i = <teacher, x_i>; the
// loss of a sample is 0.5 (<w, x_i> - y_i)^2. Gradients are sums over
// samples computed in double, so any worker (or a single-process replay)
// gets the gradient of a set of samples from its indices alone.
#ifndef STRATA_TESTING_LINEAR_MODEL_H_
#define STRATA_TESTING_LINEAR_MODEL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "strata/types.h"

namespace strata::testing {

constexpr int64_t kLinearDim = 6144;
constexpr AdamConfig kLinearAdam{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};

inline std::vector<TensorSpec> LinearModel() {
  return {{"w", {kLinearDim / 2}}, {"v", {kLinearDim / 2}}};
}

inline std::vector<double> Features(uint64_t sample) {
  std::mt19937_64 rng(sample * 0x9E3779B97F4A7C15ull + 1);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(kLinearDim);
  for (double& v : x) v = normal(rng);
  return x;
}

inline std::vector<float> LinearInitialParams() {
  std::vector<float> w(kLinearDim);
  for (int64_t j = 0; j < kLinearDim; ++j) w[j] = 0.1f * std::cos(0.37f * static_cast<float>(j));
  return w;
}

inline double Teacher(int64_t j) { return 0.5 * std::sin(0.01 * static_cast<double>(j)); }

// Gradient of the summed loss of samples [begin, end) at flat parameters
// `w` (the model's tensors laid out with 64-element alignment: kLinearDim/2
// is a multiple of 64, so they are contiguous), as FP32 over `num_params`.
inline std::vector<float> SumGradient(const std::vector<float>& w, uint64_t begin, uint64_t end) {
  std::vector<double> g(w.size(), 0.0);
  for (uint64_t i = begin; i < end; ++i) {
    std::vector<double> x = Features(i);
    double residual = 0.0;
    for (int64_t j = 0; j < kLinearDim; ++j) residual += (w[j] - Teacher(j)) * x[j];
    for (int64_t j = 0; j < kLinearDim; ++j) g[j] += residual * x[j];
  }
  return std::vector<float>(g.begin(), g.end());
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_LINEAR_MODEL_H_
