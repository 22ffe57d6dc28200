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

// The formula and the order of operations of AdamMath in
// kernels/cpu/kernels_impl.h.
__device__ void AdamMath(const AdamConstants& c, float grad, float& param, float& m, float& v) {
  float g = __fmul_rn(c.coef, grad);
  g = __fadd_rn(g, __fmul_rn(c.l2, param));
  param = __fmul_rn(param, c.decay);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(c.one_minus_beta2, __fmul_rn(g, g)));
  float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_bias_correction2_sqrt), c.eps);
  param = __fsub_rn(param, __fmul_rn(c.step_size, __fdiv_rn(m, denom)));
}

template <DType G, DType C>
__global__ void AdamKernel(AdamConstants c, const void* grads, float* p, float* m, float* v,
                           void* copy, size_t n) {
  using GE = Element<G>;
  using CE = Element<C>;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float param = p[i];
    float mi = m[i];
    float vi = v[i];
    AdamMath(c, GE::Load(static_cast<const typename GE::T*>(grads), i), param, mi, vi);
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    CE::Store(static_cast<typename CE::T*>(copy), i, param);
  }
}

// The codes of kernels/int8_adam.h, as kernels/cpu/int8_codes.h computes
// them (the same integer operations on the FP32 bits).
template <uint32_t kTop, uint32_t kMaxMagnitude>
struct Codes {
  static constexpr uint32_t kOffset = (127 - kTop) << 3;
  static __device__ float Decode(uint32_t code, float scale) {
    const uint32_t magnitude = code & kMaxMagnitude;
    uint32_t bits = (magnitude + kOffset) << 20;
    if (magnitude < 8) {
      bits = __float_as_uint(__fmul_rn(__int2float_rn(static_cast<int>(magnitude)),
                                       __uint_as_float((127 - 2 - kTop) << 23)));
    }
    if (kMaxMagnitude == 127) bits |= (code & 0x80) << 24;
    return __fmul_rn(__uint_as_float(bits), scale);
  }
  // Nearest, ties to even.
  static __device__ uint32_t Encode(float y) {
    const uint32_t bits = __float_as_uint(y);
    const uint32_t magnitude_bits = bits & 0x7fffffffu;
    const float magnitude = __uint_as_float(magnitude_bits);
    uint32_t code;
    if (magnitude < __uint_as_float((127 + 1 - kTop) << 23)) {
      const uint32_t magic = (127 + 21 - kTop) << 23;
      code = __float_as_uint(__fadd_rn(magnitude, __uint_as_float(magic))) - magic;
    } else {
      const uint32_t rounded = magnitude_bits + 0x7ffffu + ((magnitude_bits >> 20) & 1);
      code = min((rounded >> 20) - kOffset, kMaxMagnitude);
    }
    if (kMaxMagnitude == 127) code |= (bits & 0x80000000u) >> 24;
    return code;
  }
};
using MCodes = Codes<15, 127>;
using VCodes = Codes<31, 255>;

__device__ uint32_t RandomBits(uint32_t seed, uint32_t index) {
  uint32_t x = index ^ seed;
  x = (x ^ (x >> 16)) * 0x7feb352du;
  x = (x ^ (x >> 15)) * 0x846ca68bu;
  return x ^ (x >> 16);
}

__device__ uint32_t EncodeStochasticV(float y, uint32_t random) {
  const float aligned =
      __fmul_rn(__uint_as_float(__float_as_uint(y) & 0x7fffffffu), __uint_as_float(31u << 23));
  return min((__float_as_uint(aligned) + (random >> 12)) >> 20, 255u);
}

// The largest of every thread's x in the block (exact: max is).
__device__ float BlockMax(float x, float* shared) {
  shared[threadIdx.x] = x;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width)
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const float largest = shared[0];
  __syncthreads();
  return largest;
}

// One thread block per block of kInt8StateBlock parameters (kThreads is that).
template <DType G, DType C>
__global__ void AdamInt8Kernel(AdamConstants c, const void* grads, float* p, Int8Moments s,
                               Int8Rounding rounding, void* copy, size_t n) {
  static_assert(kThreads == kInt8StateBlock);
  __shared__ float shared[kThreads];
  for (size_t b = blockIdx.x; b * kInt8StateBlock < n; b += gridDim.x) {
    const size_t i = b * kInt8StateBlock + threadIdx.x;
    const bool here = i < n;
    float m = 0.0f, v = 0.0f;
    if (here) {
      float param = p[i];
      m = MCodes::Decode(s.m[i], s.m_scale[b]);
      v = VCodes::Decode(s.v[i], s.v_scale[b]);
      AdamMath(c, Element<G>::Load(static_cast<const typename Element<G>::T*>(grads), i), param, m,
               v);
      p[i] = param;
      Element<C>::Store(static_cast<typename Element<C>::T*>(copy), i, param);
    }
    const float m_largest = BlockMax(fabsf(m), shared);
    const float v_largest = BlockMax(fabsf(v), shared);
    if (!here) continue;
    const bool m_zero = !(m_largest >= 0x1p-126f), v_zero = !(v_largest >= 0x1p-126f);
    const float m_inverse = m_zero ? 0.0f : __fdiv_rn(1.0f, m_largest);
    const float v_inverse = v_zero ? 0.0f : __fdiv_rn(1.0f, v_largest);
    if (threadIdx.x == 0) {
      s.m_scale[b] = m_zero ? 0.0f : m_largest;
      s.v_scale[b] = v_zero ? 0.0f : v_largest;
    }
    const uint32_t v_code = EncodeStochasticV(
        __fmul_rn(v, v_inverse),
        RandomBits(rounding.seed, rounding.first_index + static_cast<uint32_t>(i)));
    const uint32_t m_code = v_code == 0 ? 0 : MCodes::Encode(__fmul_rn(m, m_inverse));
    s.m[i] = static_cast<uint8_t>(m_code);
    s.v[i] = static_cast<uint8_t>(v_code);
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

template <DType D>
__global__ void AccumulateScaledKernel(const float* x, float scale, void* acc, size_t n) {
  using E = Element<D>;
  auto* a = static_cast<typename E::T*>(acc);
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    E::Store(a, i, __fadd_rn(E::Load(a, i), __fmul_rn(scale, x[i])));
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

absl::Status CudaAdamUpdateInt8(const AdamConstants& c, DType grad_dtype, const void* grads,
                                float* p, Int8Moments moments, Int8Rounding rounding,
                                DType copy_dtype, void* copy, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  const size_t blocks = Int8StateBlocks(n);
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  WithDType(grad_dtype, [&](auto g) {
    WithDType(copy_dtype, [&](auto cp) {
      AdamInt8Kernel<decltype(g)::value, decltype(cp)::value>
          <<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(c, grads, p, moments, rounding,
                                                                     copy, n);
    });
  });
  return CudaStatus(cudaGetLastError(), "8-bit AdamW launch");
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

absl::Status CudaAccumulateScaled(DType dtype, const float* x, float scale, void* acc, size_t n,
                                  void* stream) {
  if (n == 0) return absl::OkStatus();
  WithDType(dtype, [&](auto d) {
    AccumulateScaledKernel<decltype(d)::value>
        <<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, scale, acc, n);
  });
  return CudaStatus(cudaGetLastError(), "accumulate launch");
}

}  // namespace strata
