// The kernels on a CUDA device: the same fused AdamW (FP32 and 8-bit
// states), gradient statistics, casts and accumulation as the CPU variants, over device pointers,
// on a stream.
// Built only where the CUDA toolkit is found (STRATA_HAVE_CUDA). Compiled without FMA contraction
// and with IEEE division and square root, so AdamW and the casts give the same bits as the CPU
// kernels; the sum of squares adds every square in double, in another order (relative difference
// below 1e-6: the CPU form sums 8 squares at a time in FP32, see grad_stats.h). Thread-safe: each
// call is independent; calls on one stream run in order.
#ifndef STRATA_KERNELS_CUDA_CUDA_KERNELS_H_
#define STRATA_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/adam.h"
#include "kernels/grad_stats.h"
#include "kernels/int8_adam.h"
#include "strata/types.h"

namespace strata {

// Whether a CUDA device can be used (false on machines without a GPU).
bool CudaDevicePresent();

// Each returns UNAVAILABLE with CUDA's message when a launch or copy fails.
// `stream` is a cudaStream_t (nullptr: the default stream). CudaAdamUpdate's
// `copy` may be `grads` when the two dtypes are one: each element of the
// gradients is read before its copy is written.
absl::Status CudaAdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                            float* m, float* v, DType copy_dtype, void* copy, size_t n,
                            void* stream);
// kernels/int8_adam.h's AdamUpdateInt8; every pointer of `moments` on the
// device; `copy` may be `grads` as above.
absl::Status CudaAdamUpdateInt8(const AdamConstants& c, DType grad_dtype, const void* grads,
                                float* p, Int8Moments moments, Int8Rounding rounding,
                                DType copy_dtype, void* copy, size_t n, void* stream);
// Waits for the stream; `stats` is host memory.
absl::Status CudaGradStats(DType dtype, const void* grads, size_t n, GradStats* stats,
                           void* stream);
absl::Status CudaCastFromFloat(const float* from, DType dtype, void* to, size_t n, void* stream);
absl::Status CudaCastToFloat(DType dtype, const void* from, float* to, size_t n, void* stream);
// kernels/elementwise.h's AccumulateScaled: acc[i] = round(float(acc[i]) +
// scale * x[i]) in `dtype`, the same bits.
absl::Status CudaAccumulateScaled(DType dtype, const float* x, float scale, void* acc, size_t n,
                                  void* stream);

}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_CUDA_KERNELS_H_
