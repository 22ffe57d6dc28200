// GpuMlp (gpu_mlp.h) on CUDA: cuBLAS 16-bit products with FP32 accumulation
// and the small kernels between them, on the legacy default stream (which
// the strata client's device stream waits for).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "examples/gpu_mlp.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace strata::examples {
namespace {

constexpr int kThreads = 256;

absl::Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cuBLAS ", what, ": ", cublasGetStatusString(s)));
}

unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// 16-bit storage of the compute dtype.
__device__ uint16_t To16(float x, bool bf16) {
  if (bf16) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t*>(&b);
  }
  __half h = __float2half_rn(x);
  return *reinterpret_cast<uint16_t*>(&h);
}
__device__ float From16(uint16_t x, bool bf16) {
  if (bf16) return __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&x));
  return __half2float(*reinterpret_cast<__half*>(&x));
}
__device__ float Round16(float x, bool bf16) { return From16(To16(x, bf16), bf16); }

__device__ uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// x[s][i]: a standard normal (Box-Muller) drawn from the sample's index.
__global__ void InputKernel(uint64_t first, int count, int dim, bool bf16, uint16_t* x) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= size_t(count) * dim) return;
  const uint64_t bits = SplitMix((first + i / dim) * 0x100000001B3ull + i % dim);
  const float u1 = ((bits >> 40) + 1.0f) / 16777217.0f, u2 = (bits & 0xFFFFFF) / 16777216.0f;
  x[i] = To16(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2), bf16);
}

// h = round(relu(pre + bias)) over rows of `dim`: 16-bit for the next product.
__global__ void BiasReluKernel(const float* pre, const float* bias, int rows, int dim, bool bf16,
                               uint16_t* h) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < size_t(rows) * dim) h[i] = To16(fmaxf(pre[i] + bias[i % dim], 0.0f), bf16);
}

// The output layer's error against the teacher: per element its loss
// (0.5 err^2 / out), and dy = err / out / divisor in FP32 and 16 bits.
__global__ void ErrorKernel(const float* y_pre, const float* b2, const float* t_pre,
                            const float* teacher_b2, int rows, int out, int divisor, bool bf16,
                            float* loss, float* dy, uint16_t* dy16) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= size_t(rows) * out) return;
  const float y = Round16(y_pre[i] + b2[i % out], bf16);
  const float t = Round16(t_pre[i] + teacher_b2[i % out], bf16);
  const float err = y - t;
  loss[i] = 0.5f * err * err / out;
  dy[i] = err / out / divisor;
  dy16[i] = To16(dy[i], bf16);
}

// dh = (h > 0) ? dh_pre : 0, in FP32 and 16 bits.
__global__ void ReluBackwardKernel(const uint16_t* h, const float* dh_pre, size_t n, bool bf16,
                                   float* dh, uint16_t* dh16) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  dh[i] = From16(h[i], bf16) > 0.0f ? dh_pre[i] : 0.0f;
  dh16[i] = To16(dh[i], bf16);
}

// sums[j] = the sum over `rows` of column j, in row order (deterministic).
__global__ void ColumnSumKernel(const float* m, int rows, int cols, float* sums) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += m[size_t(r) * cols + j];
  sums[j] = s;
}

// A block of GPU memory of `n` T, freed with the model.
template <typename T>
class Buffer {
 public:
  absl::Status Allocate(size_t n) {
    n_ = n;
    return CudaStatus(cudaMalloc(&data_, std::max<size_t>(n, 1) * sizeof(T)), "malloc");
  }
  ~Buffer() { cudaFree(data_); }
  T* get() const { return data_; }
  size_t size() const { return n_; }

 private:
  T* data_ = nullptr;
  size_t n_ = 0;
};

class CudaMlp : public GpuMlp {
 public:
  CudaMlp(const MlpDims& dims, DType dtype, const FlatLayout& layout, int max_samples)
      : d_(dims), bf16_(dtype == DType::kBf16), max_samples_(max_samples) {
    for (int t = 0; t < 4; ++t) offset_[t] = layout.tensor_range(t).begin;
    n_ = layout.num_params();
  }
  ~CudaMlp() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
  }

  absl::Status Init(int ordinal, absl::Span<const float> teacher) {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "set device"));
    RETURN_IF_ERROR(Cublas(cublasCreate(&blas_), "create"));
    const size_t b = max_samples_;
    for (Buffer<float>* f : {&params_, &grads_, &teacher_}) RETURN_IF_ERROR(f->Allocate(n_));
    RETURN_IF_ERROR(w1_.Allocate(size_t(d_.in) * d_.hidden));
    RETURN_IF_ERROR(w2_.Allocate(size_t(d_.hidden) * d_.out));
    RETURN_IF_ERROR(tw1_.Allocate(size_t(d_.in) * d_.hidden));
    RETURN_IF_ERROR(tw2_.Allocate(size_t(d_.hidden) * d_.out));
    RETURN_IF_ERROR(x_.Allocate(b * d_.in));
    RETURN_IF_ERROR(h_.Allocate(b * d_.hidden));
    RETURN_IF_ERROR(th_.Allocate(b * d_.hidden));
    RETURN_IF_ERROR(dh16_.Allocate(b * d_.hidden));
    RETURN_IF_ERROR(dy16_.Allocate(b * d_.out));
    RETURN_IF_ERROR(pre_.Allocate(b * d_.hidden));
    RETURN_IF_ERROR(dh_.Allocate(b * d_.hidden));
    RETURN_IF_ERROR(y_pre_.Allocate(b * d_.out));
    RETURN_IF_ERROR(t_pre_.Allocate(b * d_.out));
    RETURN_IF_ERROR(dy_.Allocate(b * d_.out));
    RETURN_IF_ERROR(loss_.Allocate(b * d_.out));
    RETURN_IF_ERROR(CudaStatus(cudaMemset(grads_.get(), 0, n_ * sizeof(float)), "memset"));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(teacher_.get(), teacher.data(), n_ * sizeof(float), cudaMemcpyHostToDevice),
        "copy"));
    RETURN_IF_ERROR(Cast(teacher_.get() + offset_[0], tw1_));
    RETURN_IF_ERROR(Cast(teacher_.get() + offset_[2], tw2_));
    return CudaStatus(cudaDeviceSynchronize(), "synchronize");
  }

  absl::Span<float> params() override { return {params_.get(), n_}; }
  absl::Span<float> grads() override { return {grads_.get(), n_}; }

  absl::StatusOr<double> MicroBatch(uint64_t first, int count, int divisor) override {
    if (count < 1 || count > max_samples_) {
      return absl::InvalidArgumentError(
          absl::StrCat("micro-batch of ", count, " samples; the model takes 1 to ", max_samples_));
    }
    const int b = count;
    InputKernel<<<Blocks(size_t(b) * d_.in), kThreads>>>(first, b, d_.in, bf16_, x_.get());
    RETURN_IF_ERROR(Cast(params_.get() + offset_[0], w1_));
    RETURN_IF_ERROR(Cast(params_.get() + offset_[2], w2_));
    // Teacher and student forward: pre = x W1; h = relu(pre + b1); y_pre = h W2.
    RETURN_IF_ERROR(Forward(b, tw1_, teacher_.get() + offset_[1], tw2_, th_, t_pre_));
    RETURN_IF_ERROR(Forward(b, w1_, params_.get() + offset_[1], w2_, h_, y_pre_));
    ErrorKernel<<<Blocks(size_t(b) * d_.out), kThreads>>>(
        y_pre_.get(), params_.get() + offset_[3], t_pre_.get(), teacher_.get() + offset_[3], b,
        d_.out, divisor, bf16_, loss_.get(), dy_.get(), dy16_.get());
    // Backward: gW2 = h^T dy, gb2 = sum dy, dh = (dy W2^T) * [h > 0],
    // gW1 = x^T dh, gb1 = sum dh. The padding between tensors stays zero.
    float* g = grads_.get();
    RETURN_IF_ERROR(Gemm(true, false, d_.hidden, d_.out, b, h_.get(), dy16_.get(), g + offset_[2]));
    ColumnSumKernel<<<Blocks(d_.out), kThreads>>>(dy_.get(), b, d_.out, g + offset_[3]);
    RETURN_IF_ERROR(Gemm(false, true, b, d_.hidden, d_.out, dy16_.get(), w2_.get(), pre_.get()));
    ReluBackwardKernel<<<Blocks(size_t(b) * d_.hidden), kThreads>>>(
        h_.get(), pre_.get(), size_t(b) * d_.hidden, bf16_, dh_.get(), dh16_.get());
    RETURN_IF_ERROR(Gemm(true, false, d_.in, d_.hidden, b, x_.get(), dh16_.get(), g + offset_[0]));
    ColumnSumKernel<<<Blocks(d_.hidden), kThreads>>>(dh_.get(), b, d_.hidden, g + offset_[1]);
    std::vector<float> loss(size_t(b) * d_.out);
    RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "launch"));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(loss.data(), loss_.get(), loss.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "copy"));
    double sum = 0;
    for (float l : loss) sum += l;
    return sum;
  }

 private:
  absl::Status Cast(const float* from, Buffer<uint16_t>& to) {
    return CudaCastFromFloat(from, bf16_ ? DType::kBf16 : DType::kFp16, to.get(), to.size(),
                             /*stream=*/nullptr);
  }

  // pre = x w1; h = relu(pre + b1) in 16 bits; y_pre = h w2 (FP32).
  absl::Status Forward(int b, const Buffer<uint16_t>& w1, const float* b1,
                       const Buffer<uint16_t>& w2, Buffer<uint16_t>& h, Buffer<float>& y_pre) {
    RETURN_IF_ERROR(Gemm(false, false, b, d_.hidden, d_.in, x_.get(), w1.get(), pre_.get()));
    BiasReluKernel<<<Blocks(size_t(b) * d_.hidden), kThreads>>>(pre_.get(), b1, b, d_.hidden, bf16_,
                                                                h.get());
    return Gemm(false, false, b, d_.out, d_.hidden, h.get(), w2.get(), y_pre.get());
  }

  // Row-major c[m x n] = op(a) op(b), 16-bit a and b, FP32 c and
  // accumulation: a is [m x k] ([k x m] when ta), b [k x n] ([n x k] when
  // tb). cuBLAS is column-major, so it computes c^T = op(b)^T op(a)^T.
  absl::Status Gemm(bool ta, bool tb, int m, int n, int k, const uint16_t* a, const uint16_t* b,
                    float* c) {
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = bf16_ ? CUDA_R_16BF : CUDA_R_16F;
    return Cublas(
        cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                     &one, b, t, tb ? k : n, a, t, ta ? m : k, &zero, c, CUDA_R_32F, n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "gemm");
  }

  const MlpDims d_;
  const bool bf16_;
  const int max_samples_;
  uint64_t offset_[4];
  size_t n_;
  cublasHandle_t blas_ = nullptr;
  Buffer<float> params_, grads_, teacher_;              // flat FP32
  Buffer<uint16_t> w1_, w2_, tw1_, tw2_;                // 16-bit weights
  Buffer<uint16_t> x_, h_, th_, dh16_, dy16_;           // 16-bit activations
  Buffer<float> pre_, dh_, y_pre_, t_pre_, dy_, loss_;  // FP32 activations
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuMlp>> GpuMlp::Create(int ordinal, const MlpDims& dims,
                                                       DType dtype, const FlatLayout& layout,
                                                       absl::Span<const float> teacher,
                                                       int max_samples) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device ", ordinal));
  }
  auto mlp = std::make_unique<CudaMlp>(dims, dtype, layout, max_samples);
  RETURN_IF_ERROR(mlp->Init(ordinal, teacher));
  return std::unique_ptr<GpuMlp>(std::move(mlp));
}

}  // namespace strata::examples
