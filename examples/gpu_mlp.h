// GpuMlp: the example trainer's two-layer MLP (mlp_trainer.cc) on a CUDA
// GPU: y = relu(x W1 + b1) W2 + b2, trained to imitate a fixed teacher MLP
// on generated inputs. Forward and backward run in 16-bit (FP16 or BF16)
// matrix products with FP32 accumulation (cuBLAS) and small kernels; the
// parameters and gradients are FP32 buffers in GPU memory that the strata
// client reads and fills in place (ClientOptions::device "cuda:N").
//
// Not thread-safe: one thread uses an instance. Built where the CUDA toolkit
// is found; elsewhere Create() answers FAILED_PRECONDITION.
#ifndef STRATA_EXAMPLES_GPU_MLP_H_
#define STRATA_EXAMPLES_GPU_MLP_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "strata/flat_layout.h"
#include "strata/types.h"

namespace strata::examples {

struct MlpDims {
  int in, hidden, out;
};

class GpuMlp {
 public:
  virtual ~GpuMlp() = default;

  // A model on GPU `ordinal` whose flat tensors are `layout`'s four (W1
  // [in x hidden], b1, W2 [hidden x out], b2), computing in `dtype`, for
  // micro-batches of up to `max_samples`. `teacher` is the teacher's flat
  // FP32 parameters (host memory).
  static absl::StatusOr<std::unique_ptr<GpuMlp>> Create(int ordinal, const MlpDims& dims,
                                                        DType dtype, const FlatLayout& layout,
                                                        absl::Span<const float> teacher,
                                                        int max_samples);

  // The student's FP32 parameters and gradients, flat, in GPU memory.
  virtual absl::Span<float> params() = 0;
  virtual absl::Span<float> grads() = 0;

  // Forward and backward of samples [first, first + count) (each sample's
  // input drawn from its index): the gradient of the summed loss divided by
  // `divisor` goes into grads() (overwritten); returns the summed loss. The
  // GPU's work is done when it returns.
  virtual absl::StatusOr<double> MicroBatch(uint64_t first, int count, int divisor) = 0;
};

}  // namespace strata::examples

#endif  // STRATA_EXAMPLES_GPU_MLP_H_
