// GpuMlp::Create() where strata is built without the CUDA toolkit.
#include "examples/gpu_mlp.h"

namespace strata::examples {

absl::StatusOr<std::unique_ptr<GpuMlp>> GpuMlp::Create(int, const MlpDims&, DType,
                                                       const FlatLayout&, absl::Span<const float>,
                                                       int) {
  return absl::FailedPreconditionError("this build of strata has no CUDA");
}

}  // namespace strata::examples
