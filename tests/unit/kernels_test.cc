// Kernels against independent double-precision references, on sizes that
// exercise tails.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "kernels/elementwise.h"
#include "kernels/grad_stats.h"
#include "kernels/half.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

const size_t kSizes[] = {0, 1, 15, 16, 17, 64 * 1024 + 3};

// The value a binary16 encodes, computed from its fields.
double HalfValue(uint16_t h) {
  int exponent = (h >> 10) & 0x1f;
  int mantissa = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(HalfTest, EveryHalfDecodesToItsValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double want = HalfValue(static_cast<uint16_t>(h));
    float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << h;
      EXPECT_EQ(FloatToHalf(got), h) << "round trip of " << h;
    }
  }
}

// The nearest finite half to x by search, ties to even; Inf beyond 65520.
uint16_t NearestHalf(float x) {
  double ax = std::fabs(static_cast<double>(x));
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (ax >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0;
  for (uint16_t step = 0x4000; step > 0; step >>= 1) {
    if (HalfValue(lo + step) <= ax) lo += step;
  }
  double below = HalfValue(lo), above = HalfValue(lo + 1);
  if (below == ax) return sign | lo;
  double d_below = ax - below, d_above = above - ax;
  if (d_below < d_above || (d_below == d_above && (lo & 1) == 0)) return sign | lo;
  return sign | (lo + 1);
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(testing::TestSeed());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    // Floats whose exponent lies around the half range, subnormals included.
    uint32_t u = (bits(rng) & 0x807fffff) | ((100 + bits(rng) % 45) << 23);
    float x = BitsToFloat(u);
    ASSERT_EQ(FloatToHalf(x), NearestHalf(x)) << x;
  }
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e30f), 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808000)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f818000)), 0x3f82);  // tie, even above
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7f7fffff)), 0x7f80);  // overflow to Inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

struct AdamCase {
  DType grad_dtype;
  bool adamw;
  float weight_decay;
  int64_t step;
};

class AdamTest : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamTest, MatchesDoubleReference) {
  const AdamCase& tc = GetParam();
  std::mt19937 rng(testing::TestSeed());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AdamConfig config{1e-3f, 0.9f, 0.999f, 1e-8f, tc.weight_decay, tc.adamw};
  const float coef = 0.37f;
  for (size_t n : kSizes) {
    std::vector<float> p(n), m(n), v(n), g32(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      m[i] = 0.1f * normal(rng);
      v[i] = 0.01f * std::fabs(normal(rng));
      g32[i] = normal(rng);
    }
    std::vector<uint16_t> g16(n);
    if (tc.grad_dtype != DType::kFp32) CastFromFloat(g32.data(), tc.grad_dtype, g16.data(), n);
    const void* grads = tc.grad_dtype == DType::kFp32 ? static_cast<const void*>(g32.data())
                                                      : static_cast<const void*>(g16.data());
    std::vector<float> p0 = p, m0 = m, v0 = v;
    std::vector<uint16_t> copy(n);
    AdamUpdate(MakeAdamConstants(config, tc.step, coef), tc.grad_dtype, grads, p.data(), m.data(),
               v.data(), DType::kFp16, copy.data(), n);
    // The reference works in double, with torch's semantics: beta1, beta2
    // and L2's weight decay multiply as the floats they are; 1 - beta, the
    // bias corrections, lr and AdamW's 1 - lr * wd come from the decimals
    // written above. Its tolerances bound float rounding relative to the
    // magnitude of each expression's terms (sums may cancel), and carry m's
    // error into p.
    ASSERT_TRUE(tc.weight_decay == 0.0f || tc.weight_decay == 0.01f);
    const double b1 = config.beta1, b2 = config.beta2, eps = config.eps;
    const double one_minus_b1 = 1 - 0.9, one_minus_b2 = 1 - 0.999, lr = 1e-3;
    const double wd = config.weight_decay;
    const double decay = 1 - lr * (tc.weight_decay == 0.0f ? 0.0 : 0.01);
    const double bc1 = 1 - std::pow(0.9, static_cast<double>(tc.step));
    const double bc2 = 1 - std::pow(0.999, static_cast<double>(tc.step));
    const double u = std::ldexp(1.0, -24);  // float unit roundoff
    for (size_t i = 0; i < n; ++i) {
      double g =
          static_cast<double>(coef) *
          (tc.grad_dtype == DType::kFp32
               ? g32[i]
               : (tc.grad_dtype == DType::kFp16 ? HalfToFloat(g16[i]) : Bf16ToFloat(g16[i])));
      double param = p0[i];
      // |terms| of g: the float sum g = coef * grad + wd * p may cancel.
      double g_magnitude = std::fabs(g);
      if (tc.adamw) {
        param *= decay;
      } else {
        g_magnitude += std::fabs(wd * param);
        g += wd * param;
      }
      double mi = b1 * m0[i] + one_minus_b1 * g;
      double vi = b2 * v0[i] + one_minus_b2 * g * g;
      double denom = std::sqrt(vi) / std::sqrt(bc2) + eps;
      double update = lr / bc1 * mi / denom;
      double tol_m = 8 * u * (b1 * std::fabs(m0[i]) + one_minus_b1 * g_magnitude) + 1e-30;
      double tol_v = 8 * u * (b2 * v0[i] + one_minus_b2 * g_magnitude * g_magnitude) + 1e-30;
      double tol_p = 8 * u * (std::fabs(param) + std::fabs(update)) + 2 * lr / bc1 * tol_m / denom +
                     std::fabs(update) * tol_v / vi;
      param -= update;
      ASSERT_NEAR(m[i], mi, tol_m) << "m, n=" << n << " i=" << i;
      ASSERT_NEAR(v[i], vi, tol_v) << "v, n=" << n << " i=" << i;
      ASSERT_NEAR(p[i], param, tol_p) << "p, n=" << n << " i=" << i;
      ASSERT_EQ(copy[i], FloatToHalf(p[i])) << "copy, n=" << n << " i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AdamTest,
                         ::testing::Values(AdamCase{DType::kFp16, true, 0.0f, 1},
                                           AdamCase{DType::kFp16, true, 0.01f, 10000},
                                           AdamCase{DType::kBf16, true, 0.01f, 1},
                                           AdamCase{DType::kFp32, false, 0.01f, 10000},
                                           AdamCase{DType::kFp16, false, 0.0f, 10000}));

// The value element i of a gradient buffer encodes, decoded from its bits.
double DecodedValue(DType dtype, const uint8_t* bytes, size_t i) {
  switch (dtype) {
    case DType::kFp16: {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return HalfValue(h);
    }
    case DType::kBf16: {
      uint16_t b;
      std::memcpy(&b, bytes + 2 * i, 2);
      uint32_t bits = uint32_t{b} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFp32: {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      return f;
    }
  }
  return NAN;
}

// x in `dtype`, and the sum of the squares of what it encodes, in double.
struct EncodedGrads {
  std::vector<uint8_t> bytes;
  double sum_squares = 0;
};

EncodedGrads Encode(DType dtype, const std::vector<float>& x) {
  EncodedGrads e{std::vector<uint8_t>(x.size() * DTypeSize(dtype))};
  CastFromFloat(x.data(), dtype, e.bytes.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double v = DecodedValue(dtype, e.bytes.data(), i);
    e.sum_squares += v * v;
  }
  return e;
}

const DType kGradDTypes[] = {DType::kFp16, DType::kBf16, DType::kFp32};

// Squares are summed 8 at a time in FP32 before double: relative error at
// most 8 * 2^-24 (grad_stats.h).
constexpr double kSumSquaresRelError = 1e-6;

TEST(GradStatsTest, SumOfSquaresMatchesDoublePrecision) {
  std::mt19937 rng(testing::TestSeed());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (DType dtype : kGradDTypes) {
    // Besides plain values: squares that overflow FP32 (1e30; FP16 has its
    // largest finite value instead), squares too small for FP32 (1e-30) and
    // FP32 denormals, each scattered through the buffer.
    const float big = dtype == DType::kFp16 ? 65504.0f : 1e30f;
    for (float special : {0.0f, big, 1e-30f, 1e-40f}) {
      for (size_t n : kSizes) {
        std::vector<float> x(n);
        for (float& e : x) e = normal(rng);
        for (size_t i = 300; special != 0.0f && i < n; i += 4099) x[i] = special;
        EncodedGrads g = Encode(dtype, x);
        GradStats stats = ComputeGradStats(dtype, g.bytes.data(), n);
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " n=" << n << " " << special);
        EXPECT_NEAR(stats.sum_squares, g.sum_squares, kSumSquaresRelError * g.sum_squares);
        EXPECT_TRUE(stats.all_finite);
      }
    }
  }
  // FP16 denormals are finite and count.
  uint16_t denormal = 0x0001;
  GradStats tiny = ComputeGradStats(DType::kFp16, &denormal, 1);
  EXPECT_TRUE(tiny.all_finite);
  EXPECT_EQ(tiny.sum_squares, std::ldexp(1.0, -48));
}

TEST(GradStatsTest, SumsTooSmallForFp32AreExact) {
  // Every square below FP32's smallest denormal: the FP32 pass sees zeros,
  // and the sum must still be right (and exactly 0 for zeros).
  const size_t n = 64 * 1024 + 3;
  std::mt19937 rng(testing::TestSeed());
  std::normal_distribution<float> normal(0.0f, 1e-30f);
  for (DType dtype : {DType::kBf16, DType::kFp32}) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    EncodedGrads g = Encode(dtype, x);
    GradStats stats = ComputeGradStats(dtype, g.bytes.data(), n);
    ASSERT_GT(g.sum_squares, 0.0);
    EXPECT_NEAR(stats.sum_squares, g.sum_squares, kSumSquaresRelError * g.sum_squares)
        << DTypeName(dtype);
    EXPECT_TRUE(stats.all_finite);
  }
  for (DType dtype : kGradDTypes) {
    std::vector<uint8_t> zeros(n * DTypeSize(dtype), 0);
    GradStats stats = ComputeGradStats(dtype, zeros.data(), n);
    EXPECT_EQ(stats.sum_squares, 0.0) << DTypeName(dtype);
    EXPECT_TRUE(stats.all_finite);
  }
}

TEST(GradStatsTest, AnInfOrNanAnywhereIsFlagged) {
  for (DType dtype : kGradDTypes) {
    for (size_t n : kSizes) {
      if (n == 0) continue;
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        for (size_t at : {size_t{0}, n / 2, n - 1}) {
          std::vector<float> x(n, 0.5f);
          x[at] = bad;
          EncodedGrads g = Encode(dtype, x);
          EXPECT_FALSE(ComputeGradStats(dtype, g.bytes.data(), n).all_finite)
              << DTypeName(dtype) << " n=" << n << " at " << at << " " << bad;
        }
      }
    }
  }
}

TEST(GradStatsTest, ManyElementsLoseNoPrecision) {
  // 2^25 + 3 ones: a float accumulator would stop counting at 2^24.
  const size_t n = (size_t{1} << 25) + 3;
  for (DType dtype : kGradDTypes) {
    EncodedGrads g = Encode(dtype, std::vector<float>(n, 1.0f));
    GradStats stats = ComputeGradStats(dtype, g.bytes.data(), n);
    EXPECT_EQ(stats.sum_squares, static_cast<double>(n)) << DTypeName(dtype);
  }
}

TEST(ElementwiseTest, AccumulateScaledAndAddRoundOnce) {
  std::vector<float> x = {1.0f, -2.5f, 1e-3f, 70000.0f};
  std::vector<uint16_t> acc(x.size());
  CastFromFloat(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}.data(), DType::kFp16, acc.data(), 4);
  AccumulateScaled(DType::kFp16, x.data(), 2.0f, acc.data(), x.size());
  EXPECT_EQ(HalfToFloat(acc[0]), 2.5f);
  EXPECT_EQ(HalfToFloat(acc[1]), -4.5f);
  EXPECT_EQ(acc[2], FloatToHalf(0.5f + 2e-3f));
  EXPECT_TRUE(std::isinf(HalfToFloat(acc[3])));  // overflow saturates to Inf
  std::vector<uint16_t> y = acc;
  AddInPlace(DType::kFp16, y.data(), acc.data(), 2);
  EXPECT_EQ(HalfToFloat(acc[0]), 5.0f);
  EXPECT_EQ(HalfToFloat(acc[1]), -9.0f);
}

}  // namespace
}  // namespace strata
