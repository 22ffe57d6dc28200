// The fused Adam/AdamW update of one range of a chunk: reads FP32 p, m, v and
// the gradient (FP16, BF16 or FP32), writes p, m, v (in place, or to other
// arrays) and the low-precision copy of p that workers pull. Pure function
// over caller-owned memory; thread-safe for disjoint ranges.
//
// Per element, with g = coef * grad (matching torch.optim.AdamW/Adam):
//   Adam:  g += weight_decay * p          AdamW: p *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bci = 1 - betai^step
#ifndef STRATA_KERNELS_ADAM_H_
#define STRATA_KERNELS_ADAM_H_

#include <cstddef>
#include <cstdint>

#include "strata/types.h"

namespace strata {

// Per-step constants, computed once per step (bias corrections included).
struct AdamConstants {
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float step_size = 0;                  // lr / bc1
  float inv_bias_correction2_sqrt = 0;  // 1 / sqrt(bc2), rounded once
  float decay = 1;                      // AdamW: 1 - lr * weight_decay
  float l2 = 0;                         // Adam: weight_decay
  float coef = 1;
};

// `step` counts from 1.
AdamConstants MakeAdamConstants(const AdamConfig& config, int64_t step, float coef);

// Where a range's p, m, v are read from, and where their updates go.
struct AdamInputs {
  const float* p;
  const float* m;
  const float* v;
};
struct AdamOutputs {
  float* p;
  float* m;
  float* v;
};

// Each output array is the input array itself (in place) or does not
// overlap any input. The same bits either way. `grads` may lie at any
// address (a push's bytes, where they were received).
void AdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, AdamInputs in,
                AdamOutputs out, DType copy_dtype, void* copy, size_t n);
// In place.
inline void AdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                       float* m, float* v, DType copy_dtype, void* copy, size_t n) {
  AdamUpdate(c, grad_dtype, grads, AdamInputs{p, m, v}, AdamOutputs{p, m, v}, copy_dtype, copy, n);
}

}  // namespace strata

#endif  // STRATA_KERNELS_ADAM_H_
