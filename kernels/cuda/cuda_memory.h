// CudaDeviceOf: which CUDA device's memory a pointer is in, as CUDA tells
// (cudaPointerGetAttributes), for code that must know whether it can hand
// a buffer to a kernel or NCCL in place. For code built where the CUDA
// toolkit is found. Thread-safe.
#ifndef STRATA_KERNELS_CUDA_CUDA_MEMORY_H_
#define STRATA_KERNELS_CUDA_CUDA_MEMORY_H_

#include <cuda_runtime.h>

namespace strata {

// The ordinal of the device whose memory (device or managed) holds `data`;
// -1 for host memory, pinned or not, and for pointers CUDA does not know.
inline int CudaDeviceOf(const void* data) {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next call
    return -1;
  }
  const bool on_device =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return on_device ? attributes.device : -1;
}

}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_CUDA_MEMORY_H_
