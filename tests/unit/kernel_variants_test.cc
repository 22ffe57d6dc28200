// Every instruction-set variant against the scalar variant, bit for bit,
// with denormals, ±Inf and NaN among the gradients. The one documented
// exception (kernels/cpu/avx512.cc): AVX-512 BF16 stores flush FP32 denormals
// to zero and may change NaN payloads.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/half.h"
#include "kernels/isa.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

// Sizes with tails, and one large enough for the streaming-store path.
const size_t kSizes[] = {0, 1, 15, 16, 17, 64 * 1024 + 3, (size_t{1} << 20) + 3};

// A 64-byte aligned buffer of n elements (streaming stores need alignment).
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t n) : n_(n), data_(static_cast<T*>(std::aligned_alloc(64, Bytes(n)))) {}
  Buffer(const Buffer& other) : Buffer(other.n_) {
    std::memcpy(data_, other.data_, n_ * sizeof(T));
  }
  ~Buffer() { std::free(data_); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  bool operator==(const Buffer& other) const {
    return std::memcmp(data_, other.data_, n_ * sizeof(T)) == 0;
  }

 private:
  static size_t Bytes(size_t n) { return (n * sizeof(T) + 63) / 64 * 64 + 64; }
  size_t n_;
  T* data_;
};

// Random floats with occasional denormals, ±Inf and NaN.
std::vector<float> Values(size_t n, std::mt19937& rng, bool specials) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(n);
  for (float& v : x) {
    v = normal(rng);
    if (!specials) continue;
    switch (pick(rng)) {
      case 0:
        v = 1e-40f;  // FP32 denormal
        break;
      case 1:
        v = 3e-6f;  // FP16 denormal
        break;
      case 2:
        v = INFINITY;
        break;
      case 3:
        v = -INFINITY;
        break;
      case 4:
        v = NAN;
        break;
      case 5:
        v = 1e6f;  // FP16 overflow
        break;
    }
  }
  return x;
}

// Bytes of `values` in `dtype` (rounded by the scalar kernels).
Buffer<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  Buffer<uint8_t> out(values.size() * DTypeSize(dtype));
  ScalarKernels().cast_from_float(values.data(), dtype, out.data(), values.size());
  return out;
}

// Whether 16-bit BF16 outputs a (scalar) and b (AVX-512) agree up to the
// documented exception.
bool Bf16Agrees(uint16_t scalar, uint16_t other) {
  if (scalar == other) return true;
  bool scalar_denormal = (scalar & 0x7f80) == 0 && (scalar & 0x7f) != 0;
  if (scalar_denormal) return other == (scalar & 0x8000);
  bool scalar_nan = (scalar & 0x7f80) == 0x7f80 && (scalar & 0x7f) != 0;
  bool other_nan = (other & 0x7f80) == 0x7f80 && (other & 0x7f) != 0;
  return scalar_nan && other_nan;
}

// Compares outputs of dtype `dtype` from the scalar and another variant.
void ExpectSameOutput(const uint8_t* scalar, const uint8_t* other, size_t n, DType dtype, Isa isa,
                      const char* what) {
  if (dtype == DType::kBf16 && isa == Isa::kAvx512) {
    const auto* s = reinterpret_cast<const uint16_t*>(scalar);
    const auto* o = reinterpret_cast<const uint16_t*>(other);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(Bf16Agrees(s[i], o[i])) << what << " i=" << i << " " << s[i] << " " << o[i];
    }
    return;
  }
  ASSERT_EQ(std::memcmp(scalar, other, n * DTypeSize(dtype)), 0)
      << what << " differs from scalar, " << IsaName(isa) << " " << DTypeName(dtype);
}

class VariantTest : public ::testing::TestWithParam<Isa> {
 protected:
  const KernelTable& kernels() const { return KernelsFor(GetParam()); }
  std::mt19937 rng_{testing::TestSeed()};
};

TEST_P(VariantTest, AdamMatchesScalarBitwise) {
  const DType kDTypes[] = {DType::kFp16, DType::kBf16, DType::kFp32};
  for (size_t n : kSizes) {
    for (DType grad_dtype : kDTypes) {
      for (DType copy_dtype : kDTypes) {
        // The large size (the streaming path) only for same-type pairs: time.
        if (n > (size_t{1} << 20) && copy_dtype != grad_dtype) continue;
        for (const auto& [adamw, wd, step] :
             {std::tuple{true, 0.0f, int64_t{1}}, std::tuple{false, 0.01f, int64_t{10000}}}) {
          AdamConstants c =
              MakeAdamConstants(AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, wd, adamw}, step, 0.25f);
          Buffer<uint8_t> grads = Encode(Values(n, rng_, /*specials=*/true), grad_dtype);
          std::vector<float> p0 = Values(n, rng_, false), m0 = Values(n, rng_, false),
                             v0 = Values(n, rng_, false);
          for (float& x : v0) x = std::fabs(x);
          Buffer<float> p(n), m(n), v(n);
          std::copy(p0.begin(), p0.end(), p.data());
          std::copy(m0.begin(), m0.end(), m.data());
          std::copy(v0.begin(), v0.end(), v.data());
          Buffer<float> p2 = p, m2 = m, v2 = v;
          const Buffer<float> p_in = p, m_in = m, v_in = v;
          Buffer<float> p3(n), m3(n), v3(n);
          Buffer<uint8_t> copy(n * DTypeSize(copy_dtype)), copy2(n * DTypeSize(copy_dtype)),
              copy3(n * DTypeSize(copy_dtype));
          ScalarKernels().adam_update(c, grad_dtype, grads.data(), {p.data(), m.data(), v.data()},
                                      {p.data(), m.data(), v.data()}, copy_dtype, copy.data(), n);
          kernels().adam_update(c, grad_dtype, grads.data(), {p2.data(), m2.data(), v2.data()},
                                {p2.data(), m2.data(), v2.data()}, copy_dtype, copy2.data(), n);
          // Out of place: the same bits, the inputs untouched.
          kernels().adam_update(c, grad_dtype, grads.data(),
                                {p_in.data(), m_in.data(), v_in.data()},
                                {p3.data(), m3.data(), v3.data()}, copy_dtype, copy3.data(), n);
          SCOPED_TRACE(::testing::Message() << "n=" << n << " grad " << DTypeName(grad_dtype)
                                            << " copy " << DTypeName(copy_dtype));
          ASSERT_TRUE(p == p2);
          ASSERT_TRUE(m == m2);
          ASSERT_TRUE(v == v2);
          ASSERT_TRUE(p == p3);
          ASSERT_TRUE(m == m3);
          ASSERT_TRUE(v == v3);
          ASSERT_TRUE(std::equal(p0.begin(), p0.end(), p_in.data()));
          ASSERT_TRUE(std::equal(v0.begin(), v0.end(), v_in.data()));
          ExpectSameOutput(copy.data(), copy2.data(), n, copy_dtype, GetParam(), "copy");
          ExpectSameOutput(copy.data(), copy3.data(), n, copy_dtype, GetParam(), "copy");
        }
      }
    }
  }
}

// Finite gradients that take every path of the sum of squares: squares that
// overflow FP32 (1e30; 6e4 for FP16, its largest range) or fall below it
// (1e-30, FP32 denormals), among plain values; with `tiny`, a buffer whose
// squares all fall below FP32.
std::vector<float> FiniteExtremes(size_t n, std::mt19937& rng, DType dtype, bool tiny) {
  std::vector<float> x = Values(n, rng, /*specials=*/false);
  if (tiny) {
    for (float& v : x) v *= 1e-30f;
    return x;
  }
  const float extremes[] = {dtype == DType::kFp16 ? 6e4f : 1e30f, 1e-30f, 1e-40f};
  std::uniform_int_distribution<size_t> pick(0, 199);
  for (float& v : x) {
    if (size_t k = pick(rng); k < std::size(extremes)) v = extremes[k];
  }
  return x;
}

TEST_P(VariantTest, GradStatsMatchScalarBitwise) {
  for (size_t n : kSizes) {
    for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
      std::vector<std::vector<float>> cases = {Values(n, rng_, false), Values(n, rng_, true),
                                               FiniteExtremes(n, rng_, dtype, false),
                                               FiniteExtremes(n, rng_, dtype, true)};
      for (size_t c = 0; c < cases.size(); ++c) {
        Buffer<uint8_t> g = Encode(cases[c], dtype);
        GradStats want = ScalarKernels().grad_stats(dtype, g.data(), n);
        GradStats got = kernels().grad_stats(dtype, g.data(), n);
        SCOPED_TRACE(::testing::Message() << "n=" << n << " " << DTypeName(dtype) << " case " << c);
        EXPECT_EQ(got.all_finite, want.all_finite);
        if (c >= 2) EXPECT_TRUE(want.all_finite);
        if (want.all_finite) {
          EXPECT_EQ(std::memcmp(&got.sum_squares, &want.sum_squares, 8), 0)
              << got.sum_squares << " vs " << want.sum_squares;
        }
      }
    }
  }
}

TEST_P(VariantTest, CastsAndAccumulationMatchScalarBitwise) {
  for (size_t n : kSizes) {
    for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
      std::vector<float> x = Values(n, rng_, true);
      size_t bytes = n * DTypeSize(dtype);
      Buffer<uint8_t> a(bytes), b(bytes);
      ScalarKernels().cast_from_float(x.data(), dtype, a.data(), n);
      kernels().cast_from_float(x.data(), dtype, b.data(), n);
      ExpectSameOutput(a.data(), b.data(), n, dtype, GetParam(), "cast_from_float");

      Buffer<float> fa(n), fb(n);
      ScalarKernels().cast_to_float(dtype, a.data(), fa.data(), n);
      kernels().cast_to_float(dtype, a.data(), fb.data(), n);
      ASSERT_TRUE(fa == fb) << "cast_to_float " << n;

      std::vector<float> y = Values(n, rng_, false);
      Buffer<uint8_t> acc_a = Encode(Values(n, rng_, false), dtype);
      Buffer<uint8_t> acc_b = acc_a;
      ScalarKernels().accumulate_scaled(dtype, y.data(), 1024.0f, acc_a.data(), n);
      kernels().accumulate_scaled(dtype, y.data(), 1024.0f, acc_b.data(), n);
      ExpectSameOutput(acc_a.data(), acc_b.data(), n, dtype, GetParam(), "accumulate_scaled");

      Buffer<uint8_t> sum_a = acc_a, sum_b = acc_a;
      ScalarKernels().add_in_place(dtype, a.data(), sum_a.data(), n);
      kernels().add_in_place(dtype, a.data(), sum_b.data(), n);
      ExpectSameOutput(sum_a.data(), sum_b.data(), n, dtype, GetParam(), "add_in_place");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, VariantTest, ::testing::ValuesIn(SupportedIsas()),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

TEST(IsaTest, Avx512Bf16FlushesFp32DenormalsAsDocumented) {
  if (KernelsFor(SupportedIsas().back()).isa != Isa::kAvx512) GTEST_SKIP() << "no AVX-512";
  std::vector<float> x(16, 1e-40f);
  uint16_t scalar[16], avx512[16];
  ScalarKernels().cast_from_float(x.data(), DType::kBf16, scalar, 16);
  Avx512Kernels().cast_from_float(x.data(), DType::kBf16, avx512, 16);
  EXPECT_NE(scalar[0], 0);  // the nearest BF16 denormal
  EXPECT_EQ(avx512[0], 0);  // flushed: the documented difference
}

TEST(IsaTest, ParseAndForce) {
  EXPECT_EQ(*ParseIsa("avx2"), Isa::kAvx2);
  EXPECT_EQ(ParseIsa("sse9").status().code(), absl::StatusCode::kInvalidArgument);
  Isa before = ActiveIsa();
  ASSERT_TRUE(SetActiveIsa(Isa::kScalar).ok());
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  ASSERT_TRUE(SetActiveIsa(before).ok());
  EXPECT_EQ(SupportedIsas().front(), Isa::kScalar);
}

}  // namespace
}  // namespace strata
