// The CUDA kernels against the CPU scalar variant: AdamW (FP32 and 8-bit
// states) and casts bit for bit, the sum of squares within the bound of cuda_kernels.h. Skips
// itself where no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/int8_adam.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

const size_t kSizes[] = {0, 1, 15, 16, 17, 64 * 1024 + 3};

// A device copy of a host vector, copied back by Host().
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, n_) * sizeof(T)), cudaSuccess);
    if (n_ > 0) cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(data_); }
  T* get() { return data_; }
  std::vector<T> Host() const {
    std::vector<T> out(n_);
    if (n_ > 0) cudaMemcpy(out.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }

 private:
  size_t n_;
  T* data_ = nullptr;
};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDevicePresent()) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937 rng_{testing::TestSeed()};
};

TEST_F(CudaKernelsTest, AdamMatchesCpuBitwise) {
  std::normal_distribution<float> normal;
  for (size_t n : kSizes) {
    for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
      std::vector<float> g32(n), p(n), m(n), v(n);
      for (size_t i = 0; i < n; ++i) {
        g32[i] = normal(rng_);
        p[i] = normal(rng_);
        m[i] = 0.1f * normal(rng_);
        v[i] = 0.01f * std::fabs(normal(rng_));
      }
      std::vector<uint8_t> grads(n * DTypeSize(dtype));
      ScalarKernels().cast_from_float(g32.data(), dtype, grads.data(), n);
      AdamConstants c =
          MakeAdamConstants(AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, 7, 0.5f);
      DeviceVector<uint8_t> d_grads(grads);
      DeviceVector<float> dp(p), dm(m), dv(v);
      DeviceVector<uint8_t> d_copy(std::vector<uint8_t>(n * DTypeSize(dtype)));
      ASSERT_TRUE(CudaAdamUpdate(c, dtype, d_grads.get(), dp.get(), dm.get(), dv.get(), dtype,
                                 d_copy.get(), n, nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> copy(n * DTypeSize(dtype));
      ScalarKernels().adam_update(c, dtype, grads.data(), {p.data(), m.data(), v.data()},
                                  {p.data(), m.data(), v.data()}, dtype, copy.data(), n);
      EXPECT_EQ(dp.Host(), p) << n;
      EXPECT_EQ(dm.Host(), m) << n;
      EXPECT_EQ(dv.Host(), v) << n;
      EXPECT_EQ(d_copy.Host(), copy) << n;
    }
  }
}

// 8-bit states: p, the copy, every code and scale as the scalar CPU variant
// gives them, over blocks of every kind (zeros, values below FLT_MIN, a
// partial last block).
TEST_F(CudaKernelsTest, Int8AdamMatchesCpuBitwise) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-40.0f, 10.0f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{64 * 1024 + 3}}) {
    for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
      std::vector<float> g32(n), p(n), m(n), v(n);
      for (size_t i = 0; i < n; ++i) {
        g32[i] = normal(rng_);
        p[i] = normal(rng_);
        m[i] = std::exp2(exponent(rng_)) * (normal(rng_) < 0 ? -1.0f : 1.0f);
        v[i] = std::exp2(2 * exponent(rng_));
        if (i / kInt8StateBlock % 5 == 1) m[i] = v[i] = 0.0f;
        if (i / kInt8StateBlock % 5 == 2) v[i] *= 0x1p-100f;
      }
      const size_t blocks = Int8StateBlocks(n);
      std::vector<uint8_t> m_codes(n), v_codes(n);
      std::vector<float> m_scale(blocks), v_scale(blocks);
      Int8Moments cpu{m_codes.data(), m_scale.data(), v_codes.data(), v_scale.data()};
      ScalarKernels().int8.quantize_moments(m.data(), v.data(), cpu, nullptr, n);
      std::vector<uint8_t> grads(n * DTypeSize(dtype));
      ScalarKernels().cast_from_float(g32.data(), dtype, grads.data(), n);
      const AdamConstants c =
          MakeAdamConstants(AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, 7, 0.5f);
      const Int8Rounding rounding{Int8RoundingSeed(2, 7), 512};
      DeviceVector<uint8_t> d_grads(grads), d_m(m_codes), d_v(v_codes);
      DeviceVector<float> dp(p), d_m_scale(m_scale), d_v_scale(v_scale);
      DeviceVector<uint8_t> d_copy(std::vector<uint8_t>(n * DTypeSize(dtype)));
      ASSERT_TRUE(CudaAdamUpdateInt8(c, dtype, d_grads.get(), dp.get(),
                                     {d_m.get(), d_m_scale.get(), d_v.get(), d_v_scale.get()},
                                     rounding, dtype, d_copy.get(), n, nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> copy(n * DTypeSize(dtype));
      ScalarKernels().int8.adam_update(c, dtype, grads.data(), p.data(), cpu, rounding, dtype,
                                       copy.data(), n);
      EXPECT_EQ(dp.Host(), p) << n;
      EXPECT_EQ(d_copy.Host(), copy) << n;
      EXPECT_EQ(d_m.Host(), m_codes) << n;
      EXPECT_EQ(d_v.Host(), v_codes) << n;
      EXPECT_EQ(d_m_scale.Host(), m_scale) << n;
      EXPECT_EQ(d_v_scale.Host(), v_scale) << n;
    }
  }
}

TEST_F(CudaKernelsTest, GradStatsAndCasts) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (size_t n : kSizes) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng_);
    for (DType dtype : {DType::kFp16, DType::kBf16}) {
      std::vector<uint8_t> cpu(n * 2);
      ScalarKernels().cast_from_float(x.data(), dtype, cpu.data(), n);
      DeviceVector<float> dx(x);
      DeviceVector<uint8_t> d16(std::vector<uint8_t>(n * 2));
      ASSERT_TRUE(CudaCastFromFloat(dx.get(), dtype, d16.get(), n, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(d16.Host(), cpu);
      DeviceVector<float> back{std::vector<float>(n)};
      ASSERT_TRUE(CudaCastToFloat(dtype, d16.get(), back.get(), n, nullptr).ok());
      std::vector<float> cpu_back(n);
      ScalarKernels().cast_to_float(dtype, cpu.data(), cpu_back.data(), n);
      EXPECT_EQ(back.Host(), cpu_back);

      GradStats want = ScalarKernels().grad_stats(dtype, cpu.data(), n);
      GradStats got;
      ASSERT_TRUE(CudaGradStats(dtype, d16.get(), n, &got, nullptr).ok());
      EXPECT_TRUE(got.all_finite);
      EXPECT_NEAR(got.sum_squares, want.sum_squares, 1e-6 * want.sum_squares);
    }
  }
}

}  // namespace
}  // namespace strata
