#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace strata {
namespace {

constexpr int kThreads = 256;

template <DType D>
struct Element;
template <>
struct Element<DType::kFp16> {
  using T = __half;
  static __device__ float Load(const T* p, size_t i) { return __half2float(p[i]); }
  static __device__ void Store(T* p, size_t i, float x) { p[i] = __float2half_rn(x); }
};
template <>
struct Element<DType::kBf16> {
  using T = __nv_bfloat16;
  static __device__ float Load(const T* p, size_t i) { return __bfloat162float(p[i]); }
  static __device__ void Store(T* p, size_t i, float x) { p[i] = __float2bfloat16_rn(x); }
};
template <>
struct Element<DType::kFp32> {
  using T = float;
  static __device__ float Load(const T* p, size_t i) { return p[i]; }
  static __device__ void Store(T* p, size_t i, float x) { p[i] = x; }
};

// The formula and the order of operations of kernels/cpu/kernels_impl.h.
template <DType G, DType C>
__global__ void AdamKernel(AdamConstants c, const void* grads, float* p, float* m, float* v,
                           void* copy, size_t n) {
  using GE = Element<G>;
  using CE = Element<C>;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float g = __fmul_rn(c.coef, GE::Load(static_cast<const typename GE::T*>(grads), i));
    float param = p[i];
    g = __fadd_rn(g, __fmul_rn(c.l2, param));
    param = __fmul_rn(param, c.decay);
    float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, g));
    float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(c.one_minus_beta2, __fmul_rn(g, g)));
    float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.inv_bias_correction2_sqrt), c.eps);
    param = __fsub_rn(param, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    CE::Store(static_cast<typename CE::T*>(copy), i, param);
  }
}

template <DType D>
__global__ void SumSquaresKernel(const void* grads, size_t n, double* sum) {
  __shared__ double partial[kThreads];
  double local = 0.0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    double x = Element<D>::Load(static_cast<const typename Element<D>::T*>(grads), i);
    local += x * x;
  }
  partial[threadIdx.x] = local;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sum, partial[0]);
}

template <DType From, DType To>
__global__ void CastKernel(const void* from, void* to, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    Element<To>::Store(static_cast<typename Element<To>::T*>(to), i,
                       Element<From>::Load(static_cast<const typename Element<From>::T*>(from), i));
  }
}

unsigned Blocks(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks == 0 ? 1 : blocks) : 65535);
}

template <typename Fn>
void WithDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFp16:
      fn(std::integral_constant<DType, DType::kFp16>{});
      return;
    case DType::kBf16:
      fn(std::integral_constant<DType, DType::kBf16>{});
      return;
    case DType::kFp32:
      fn(std::integral_constant<DType, DType::kFp32>{});
      return;
  }
}

}  // namespace

bool CudaDevicePresent() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::Status CudaAdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                            float* m, float* v, DType copy_dtype, void* copy, size_t n,
                            void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  WithDType(grad_dtype, [&](auto g) {
    WithDType(copy_dtype, [&](auto cp) {
      AdamKernel<decltype(g)::value, decltype(cp)::value>
          <<<Blocks(n), kThreads, 0, s>>>(c, grads, p, m, v, copy, n);
    });
  });
  return CudaStatus(cudaGetLastError(), "AdamW launch");
}

absl::Status CudaGradStats(DType dtype, const void* grads, size_t n, GradStats* stats,
                           void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  double* sum = nullptr;
  if (absl::Status e = CudaStatus(cudaMallocAsync(&sum, sizeof(double), s), "malloc"); !e.ok()) {
    return e;
  }
  // Sums into *sum, copies it to `host` and waits; frees `sum` on every path.
  double host = 0.0;
  auto run = [&]() -> absl::Status {
    if (absl::Status e = CudaStatus(cudaMemsetAsync(sum, 0, sizeof(double), s), "memset");
        !e.ok()) {
      return e;
    }
    if (n > 0) {
      WithDType(dtype, [&](auto d) {
        SumSquaresKernel<decltype(d)::value><<<Blocks(n), kThreads, 0, s>>>(grads, n, sum);
      });
      if (absl::Status e = CudaStatus(cudaGetLastError(), "sum of squares launch"); !e.ok()) {
        return e;
      }
    }
    if (absl::Status e = CudaStatus(
            cudaMemcpyAsync(&host, sum, sizeof(double), cudaMemcpyDeviceToHost, s), "copy");
        !e.ok()) {
      return e;
    }
    return CudaStatus(cudaStreamSynchronize(s), "synchronize");
  };
  absl::Status status = run();
  cudaFreeAsync(sum, s);
  stats->sum_squares = host;
  stats->all_finite = std::isfinite(host);
  return status;
}

absl::Status CudaCastFromFloat(const float* from, DType dtype, void* to, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  WithDType(dtype, [&](auto d) {
    CastKernel<DType::kFp32, decltype(d)::value>
        <<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(from, to, n);
  });
  return CudaStatus(cudaGetLastError(), "cast launch");
}

absl::Status CudaCastToFloat(DType dtype, const void* from, float* to, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  WithDType(dtype, [&](auto d) {
    CastKernel<decltype(d)::value, DType::kFp32>
        <<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(from, to, n);
  });
  return CudaStatus(cudaGetLastError(), "cast launch");
}

}  // namespace strata
