// CudaStatus: a CUDA runtime result as an absl::Status -- OK, or UNAVAILABLE
// "CUDA <what>: <CUDA's message>". For code built where the CUDA toolkit is
// found (kernels, the NCCL collective, the GPU chunk state). Thread-safe.
#ifndef STRATA_KERNELS_CUDA_CUDA_STATUS_H_
#define STRATA_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

inline absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(std::string("CUDA ")
                                    .append(what.data(), what.size())
                                    .append(": ")
                                    .append(cudaGetErrorString(e)));
}

}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_CUDA_STATUS_H_
