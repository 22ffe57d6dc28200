// GpuFusedAdamSeconds() (gpu_worker_bench.h) where the CUDA toolkit is found.
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "core/status_macros.h"
#include "kernels/adam.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/gpu_worker_bench.h"

namespace strata {

absl::StatusOr<double> GpuFusedAdamSeconds(uint64_t num_params, DType dtype) {
  if (!CudaDevicePresent()) return absl::FailedPreconditionError("no CUDA device");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(0), "set device"));
  const size_t n = num_params;
  std::vector<void*> blocks;
  absl::Cleanup free = [&] {
    for (void* b : blocks) cudaFree(b);
  };
  auto allocate = [&](size_t bytes) -> absl::StatusOr<void*> {
    void* b = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&b, bytes), "malloc"));
    blocks.push_back(b);
    RETURN_IF_ERROR(CudaStatus(cudaMemset(b, 0, bytes), "memset"));
    return b;
  };
  ASSIGN_OR_RETURN(void* p, allocate(n * 4));
  ASSIGN_OR_RETURN(void* m, allocate(n * 4));
  ASSIGN_OR_RETURN(void* v, allocate(n * 4));
  ASSIGN_OR_RETURN(void* g, allocate(n * DTypeSize(dtype)));
  ASSIGN_OR_RETURN(void* copy, allocate(n * DTypeSize(dtype)));
  cudaEvent_t start, stop;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "event"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "event"));
  absl::Cleanup events = [&] {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  };
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    const AdamConstants c = MakeAdamConstants(AdamConfig{}, i + 1, 1.0f);
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start), "record"));
    RETURN_IF_ERROR(CudaAdamUpdate(c, dtype, g, static_cast<float*>(p), static_cast<float*>(m),
                                   static_cast<float*>(v), dtype, copy, n, nullptr));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop), "record"));
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop), "synchronize"));
    float elapsed = 0;
    RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&elapsed, start, stop), "elapsed"));
    if (i >= 3) ms.push_back(elapsed);  // 3 warm-ups
  }
  return Median(std::move(ms)) / 1e3;
}

}  // namespace strata
