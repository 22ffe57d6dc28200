// KernelTable: one instruction-set variant of every CPU kernel, as function
// pointers. Internal to kernels/: the public functions (adam.h, grad_stats.h,
// elementwise.h, int8_adam.h) call the table of the active variant (isa.h).
#ifndef STRATA_KERNELS_CPU_KERNEL_TABLE_H_
#define STRATA_KERNELS_CPU_KERNEL_TABLE_H_

#include <cstddef>

#include "kernels/adam.h"
#include "kernels/grad_stats.h"
#include "kernels/int8_adam.h"
#include "kernels/isa.h"
#include "strata/types.h"

namespace strata {

// The kernels of 8-bit states (int8_adam.h).
struct Int8KernelTable {
  void (*adam_update)(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                      Int8Moments moments, Int8Rounding rounding, DType copy_dtype, void* copy,
                      size_t n);
  void (*quantize_moments)(const float* m, const float* v, Int8Moments out,
                           const Int8Rounding* rounding, size_t n);
  void (*dequantize_moments)(const Int8Moments& in, float* m, float* v, size_t n);
};

struct KernelTable {
  Isa isa;
  void (*adam_update)(const AdamConstants& c, DType grad_dtype, const void* grads, AdamInputs in,
                      AdamOutputs out, DType copy_dtype, void* copy, size_t n);
  GradStats (*grad_stats)(DType dtype, const void* grads, size_t n);
  void (*cast_from_float)(const float* from, DType dtype, void* to, size_t n);
  void (*cast_to_float)(DType dtype, const void* from, float* to, size_t n);
  void (*accumulate_scaled)(DType dtype, const float* x, float scale, void* acc, size_t n);
  void (*add_in_place)(DType dtype, const void* x, void* acc, size_t n);
  Int8KernelTable int8;
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();
// The table of `isa`, which the CPU must support.
const KernelTable& KernelsFor(Isa isa);
const KernelTable& ActiveKernels();

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_KERNEL_TABLE_H_
