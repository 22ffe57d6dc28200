// The 8-bit moment format and the fused AdamW over it (kernels/int8_adam.h):
// codes against a double-precision model of the format, the update against
// a double-precision AdamW over the decoded moments, every instruction-set
// variant against the scalar one bit for bit, and a long run against FP32
// states.
#include "kernels/int8_adam.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/half.h"
#include "kernels/isa.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

// The double-precision model of int8_adam.h's formats, written from its
// comment: the value of a code at scale 1.
double CodeValue(bool is_m, int code) {
  const int top = is_m ? 15 : 31;
  const int magnitude = is_m ? code & 127 : code;
  const int e = magnitude >> 3, f = magnitude & 7;
  double value = e > 0 ? std::ldexp(1.0 + f / 8.0, e - top) : f * std::ldexp(1.0, -2 - top);
  return is_m && (code & 128) ? -value : value;
}

// The nearest code to y, ties to the even code; m keeps y's sign.
int NearestCode(bool is_m, double y) {
  const int largest = is_m ? 127 : 255;
  const double magnitude = std::fabs(y);
  int best = 0;
  for (int c = 1; c <= largest; ++c) {
    const double d = std::fabs(CodeValue(is_m, c) - magnitude);
    const double best_d = std::fabs(CodeValue(is_m, best) - magnitude);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c;
  }
  if (std::isnan(y)) best = largest;
  return is_m && std::signbit(y) ? best | 128 : best;
}

// The largest v code whose value is at most y.
int FloorCode(double y) {
  int code = 0;
  while (code < 255 && CodeValue(false, code + 1) <= y) ++code;
  return code;
}

// A signed code's place on the line of m's values: -127 .. 127, ±0 at 0.
int Ordinal(int code) { return code & 128 ? -(code & 127) : code; }

// The scale of a block and the factor to codes, as int8_adam.h defines them.
float ScaleOf(const float* x, size_t len) {
  float largest = 0;
  for (size_t i = 0; i < len; ++i) largest = std::max(largest, std::fabs(x[i]));
  return largest >= 0x1p-126f ? largest : 0.0f;
}

// Whether two float vectors hold the same bits (memcmp takes no null
// pointer, even for 0 bytes: an empty vector may have one).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Codes and scales of m and v for n parameters.
struct Moments8 {
  explicit Moments8(size_t n)
      : m(n), v(n), m_scale(Int8StateBlocks(n)), v_scale(Int8StateBlocks(n)) {}
  Int8Moments view() { return {m.data(), m_scale.data(), v.data(), v_scale.data()}; }
  bool operator==(const Moments8& o) const {
    return m == o.m && v == o.v && SameBits(m_scale, o.m_scale) && SameBits(v_scale, o.v_scale);
  }
  std::vector<uint8_t> m, v;
  std::vector<float> m_scale, v_scale;
};

class Int8AdamTest : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(testing::TestSeed()); }
  // Magnitudes spread log-uniformly over 2^-60 .. 2^20, with random signs,
  // exact zeros and, with `odd_blocks`, some blocks of nothing but zeros or
  // of values below FLT_MIN.
  std::vector<float> Spread(size_t n, bool odd_blocks = true) {
    std::uniform_real_distribution<float> exponent(-60.0f, 20.0f);
    std::uniform_int_distribution<int> pick(0, 99);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = std::exp2(exponent(rng_)) * (pick(rng_) < 50 ? -1.0f : 1.0f);
      if (pick(rng_) < 3) x[i] = 0.0f;
    }
    for (size_t b = 0; odd_blocks && b * kInt8StateBlock < n; ++b) {
      const size_t end = std::min(n, (b + 1) * kInt8StateBlock);
      if (b % 7 == 3) std::fill(x.begin() + b * kInt8StateBlock, x.begin() + end, 0.0f);
      if (b % 7 == 5) {
        for (size_t i = b * kInt8StateBlock; i < end; ++i) x[i] *= 0x1p-100f;
      }
    }
    return x;
  }
  std::mt19937 rng_;
};

const size_t kSizes[] = {0, 1, 15, 16, 17, 255, 256, 257, 3 * 256 + 31, 64 * 1024 + 3};

TEST_F(Int8AdamTest, EveryCodeDecodesToItsValue) {
  const size_t n = 256;
  for (float scale : {1.0f, 3.0f, 1e-20f, 6e30f}) {
    Moments8 codes(n);
    for (size_t i = 0; i < n; ++i) codes.m[i] = codes.v[i] = static_cast<uint8_t>(i);
    codes.m_scale[0] = codes.v_scale[0] = scale;
    std::vector<float> m(n), v(n);
    DequantizeMoments(codes.view(), m.data(), v.data(), n);
    for (int c = 0; c < 256; ++c) {
      // Code values have 4 significant bits: the product rounds once.
      EXPECT_EQ(m[c], static_cast<float>(CodeValue(true, c) * scale)) << "m code " << c;
      EXPECT_EQ(v[c], static_cast<float>(CodeValue(false, c) * scale)) << "v code " << c;
    }
  }
}

// Values of one format, block by block: each block starts with 1.0 (its
// scale, unless a larger value follows), then every value the format has,
// every midpoint between neighbours (a tie) and the floats next to it.
std::vector<float> EveryValueAndTie(bool is_m) {
  std::vector<float> x;
  for (int c = 0; c < (is_m ? 127 : 255); ++c) {
    const float a = static_cast<float>(CodeValue(is_m, c));
    const float mid = static_cast<float>((CodeValue(is_m, c) + CodeValue(is_m, c + 1)) / 2);
    for (float y : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2.0f)}) {
      for (float signed_y : {y, -y}) {
        if (!is_m && signed_y < 0) continue;
        if (x.size() % kInt8StateBlock == 0) x.push_back(1.0f);
        x.push_back(signed_y);
      }
    }
  }
  return x;
}

// Quantizing each format's values and ties, then spread values; each code
// against the nearest-code search of the model.
TEST_F(Int8AdamTest, CodesAreTheNearestTiesToEven) {
  std::vector<float> m_ties = EveryValueAndTie(true), v_ties = EveryValueAndTie(false);
  std::vector<float> spread_m = Spread(4 * kInt8StateBlock + 5), spread_v = Spread(spread_m.size());
  for (float& x : spread_v) x = std::fabs(x);
  const std::pair<std::vector<float>, std::vector<float>> cases[] = {
      {m_ties, std::vector<float>(m_ties.size(), 1.0f)},
      {std::vector<float>(v_ties.size(), 1.0f), v_ties},
      {spread_m, spread_v}};
  for (const auto& [m, v] : cases) {
    Moments8 got(m.size());
    QuantizeMoments(m.data(), v.data(), got.view(), m.size());
    for (size_t b = 0; b < got.m_scale.size(); ++b) {
      const size_t begin = b * kInt8StateBlock;
      const size_t len = std::min(kInt8StateBlock, m.size() - begin);
      const float m_scale = ScaleOf(m.data() + begin, len);
      const float v_scale = ScaleOf(v.data() + begin, len);
      ASSERT_EQ(got.m_scale[b], m_scale) << "block " << b;
      ASSERT_EQ(got.v_scale[b], v_scale) << "block " << b;
      const float m_inverse = m_scale > 0 ? 1.0f / m_scale : 0.0f;
      const float v_inverse = v_scale > 0 ? 1.0f / v_scale : 0.0f;
      for (size_t i = begin; i < begin + len; ++i) {
        const int v_code = NearestCode(false, v[i] * v_inverse);
        const int m_code = v_code == 0 ? 0 : NearestCode(true, m[i] * m_inverse);
        ASSERT_EQ(got.v[i], v_code) << "v[" << i << "] = " << v[i];
        ASSERT_EQ(got.m[i], m_code) << "m[" << i << "] = " << m[i] << " v code " << v_code;
      }
    }
  }
}

// The 32 random bits of element `index` under `seed`: the lowbias32 hash
// (C. Wellons) of seed ^ index, as kernels/cpu/int8_codes.h draws them.
uint32_t RandomBitsOf(uint32_t seed, uint32_t index) {
  uint32_t x = seed ^ index;
  x = (x ^ (x >> 16)) * 0x7feb352du;
  x = (x ^ (x >> 15)) * 0x846ca68bu;
  return x ^ (x >> 16);
}

// v's stochastic code of y (0 <= y <= 1) with `random` bits: the code below
// y, and one more where y's place between it and the next code, in 2^-20ths
// (rounded to the nearest, ties to even, where it is not whole: below the
// smallest normal code), plus the top 20 random bits reaches a whole step.
int StochasticCode(double y, uint32_t random) {
  const int lower = FloorCode(y);
  if (lower == 255) return lower;
  const double step = CodeValue(false, lower + 1) - CodeValue(false, lower);
  const double place = std::nearbyint((y - CodeValue(false, lower)) / step * 0x1p20);
  return place + (random >> 12) >= 0x1p20 ? lower + 1 : lower;
}

// Stochastically rounded v (QuantizeMomentsRounded, as the update stores
// it), in every variant, against the model: each format's values and ties,
// values spread over 2^-40 .. 1 and ties of the subnormal codes' 2^-20ths.
TEST_F(Int8AdamTest, StochasticCodesFollowTheModel) {
  std::vector<float> v = EveryValueAndTie(false);
  std::uniform_real_distribution<float> exponent(-40.0f, 0.0f);
  std::uniform_int_distribution<uint32_t> below_2_23(0, (1u << 23) - 1);
  for (int i = 0; i < 4096; ++i) {
    if (v.size() % kInt8StateBlock == 0) v.push_back(1.0f);
    v.push_back(i % 2 == 0 ? std::exp2(exponent(rng_))
                           : std::ldexp(static_cast<float>(below_2_23(rng_)) + 0.5f, -53));
  }
  std::vector<float> m(v.size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = i % 3 == 0 ? -v[i] : v[i];
  const Int8Rounding rounding{std::uniform_int_distribution<uint32_t>()(rng_), 12345};
  for (Isa isa : SupportedIsas()) {
    SCOPED_TRACE(IsaName(isa));
    Moments8 got(v.size());
    KernelsFor(isa).int8.quantize_moments(m.data(), v.data(), got.view(), &rounding, v.size());
    for (size_t b = 0; b < got.v_scale.size(); ++b) {
      const size_t begin = b * kInt8StateBlock;
      const size_t len = std::min(kInt8StateBlock, v.size() - begin);
      const float v_scale = ScaleOf(v.data() + begin, len);
      const float m_scale = ScaleOf(m.data() + begin, len);
      ASSERT_EQ(got.v_scale[b], v_scale) << "block " << b;
      const float v_inverse = 1.0f / v_scale, m_inverse = 1.0f / m_scale;
      for (size_t i = begin; i < begin + len; ++i) {
        const uint32_t random =
            RandomBitsOf(rounding.seed, rounding.first_index + static_cast<uint32_t>(i));
        const int v_code = StochasticCode(v[i] * v_inverse, random);
        const int m_code = v_code == 0 ? 0 : NearestCode(true, m[i] * m_inverse);
        ASSERT_EQ(got.v[i], v_code) << "v[" << i << "] = " << v[i];
        ASSERT_EQ(got.m[i], m_code) << "m[" << i << "] = " << m[i];
      }
    }
  }
}

// One step of AdamW on decoded moments in double, then the codes of its
// moments: p within FP32 rounding of the double step, each new moment's code
// within one of the nearest code to the double moment (FP32 rounding may
// cross a midpoint), its scale within FP32 rounding.
TEST_F(Int8AdamTest, UpdateMatchesDoublePrecision) {
  for (size_t n : kSizes) {
    for (auto [grad_dtype, config, step] :
         {std::tuple{DType::kFp32, AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, 1},
          std::tuple{DType::kBf16, AdamConfig{3e-4f, 0.8f, 0.99f, 1e-6f, 0.1f, false}, 1000}}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " step " << step);
      // Gradients and parameters whose squares and products stay normal in
      // FP32 (what underflows there is exact only in the double model).
      std::vector<float> m0 = Spread(n), v0 = Spread(n), g_values = Spread(n, false);
      for (float& x : v0) x = x * x;
      std::vector<float> p = Spread(n, false);
      for (float& x : g_values) {
        if (x != 0) x = std::copysign(std::clamp(std::fabs(x), 0x1p-50f, 1e9f), x);
      }
      std::vector<uint8_t> g(n * DTypeSize(grad_dtype));
      ScalarKernels().cast_from_float(g_values.data(), grad_dtype, g.data(), n);
      std::vector<float> g_read(n);
      ScalarKernels().cast_to_float(grad_dtype, g.data(), g_read.data(), n);
      Moments8 moments(n);
      QuantizeMoments(m0.data(), v0.data(), moments.view(), n);
      std::vector<float> m_in(n), v_in(n);
      DequantizeMoments(moments.view(), m_in.data(), v_in.data(), n);
      const std::vector<float> p_in = p;
      const AdamConstants c = MakeAdamConstants(config, step, 0.5f);
      std::vector<uint16_t> copy(n);
      AdamUpdateInt8(c, grad_dtype, g.data(), p.data(), moments.view(),
                     Int8Rounding{Int8RoundingSeed(3, step), 0}, DType::kFp16, copy.data(), n);

      std::vector<double> m_ref(n), v_ref(n);
      for (size_t i = 0; i < n; ++i) {
        double grad = double{c.coef} * g_read[i] + double{c.l2} * p_in[i];
        m_ref[i] = double{c.beta1} * m_in[i] + double{c.one_minus_beta1} * grad;
        v_ref[i] = double{c.beta2} * v_in[i] + double{c.one_minus_beta2} * grad * grad;
        const double decayed = double{p_in[i]} * c.decay;
        const double denom = std::sqrt(v_ref[i]) * double{c.inv_bias_correction2_sqrt} + c.eps;
        const double change = double{c.step_size} * m_ref[i] / denom;
        // FP32 rounds each term of m's sum: where the terms cancel, m's error
        // is relative to their magnitudes, not to m.
        const double grad_magnitude =
            std::fabs(double{c.coef} * g_read[i]) + std::fabs(double{c.l2} * p_in[i]);
        const double change_magnitude =
            double{c.step_size} *
            (std::fabs(double{c.beta1} * m_in[i]) + double{c.one_minus_beta1} * grad_magnitude) /
            denom;
        ASSERT_NEAR(p[i], decayed - change, 1e-5 * (std::fabs(decayed) + change_magnitude))
            << "p[" << i << "]";
        ASSERT_EQ(copy[i], FloatToHalf(p[i])) << "copy[" << i << "]";
      }
      for (size_t b = 0; b < moments.m_scale.size(); ++b) {
        const size_t begin = b * kInt8StateBlock;
        const size_t end = std::min(n, begin + kInt8StateBlock);
        double m_largest = 0, v_largest = 0;
        for (size_t i = begin; i < end; ++i) {
          m_largest = std::max(m_largest, std::fabs(m_ref[i]));
          v_largest = std::max(v_largest, v_ref[i]);
        }
        if (m_largest >= 0x1p-125) {
          ASSERT_NEAR(moments.m_scale[b], m_largest, 1e-5 * m_largest) << "block " << b;
        }
        if (v_largest >= 0x1p-125) {
          ASSERT_NEAR(moments.v_scale[b], v_largest, 1e-5 * v_largest) << "block " << b;
        }
        for (size_t i = begin; i < end; ++i) {
          const int v_code =
              moments.v_scale[b] > 0 ? NearestCode(false, v_ref[i] / moments.v_scale[b]) : 0;
          ASSERT_LE(std::abs(moments.v[i] - v_code), 1) << "v[" << i << "]";
          if (moments.v[i] == 0) {
            ASSERT_EQ(moments.m[i], 0) << "m[" << i << "] with v coded 0";
            continue;
          }
          const int m_code =
              moments.m_scale[b] > 0 ? NearestCode(true, m_ref[i] / moments.m_scale[b]) : 0;
          ASSERT_LE(std::abs(Ordinal(moments.m[i]) - Ordinal(m_code)), 1) << "m[" << i << "]";
        }
      }
    }
  }
}

TEST_F(Int8AdamTest, EveryVariantMatchesScalarBitwise) {
  for (Isa isa : SupportedIsas()) {
    const KernelTable& kernels = KernelsFor(isa);
    // The last size takes the streaming-store path of the copy.
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{256}, size_t{3 * 256 + 31},
                     (size_t{1} << 20) + 3}) {
      for (DType grad_dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
        SCOPED_TRACE(::testing::Message()
                     << IsaName(isa) << " n=" << n << " grad " << DTypeName(grad_dtype));
        std::vector<float> m0 = Spread(n), v0 = Spread(n), g_values = Spread(n), p = Spread(n);
        for (float& x : v0) x = x * x;
        // Finite in every gradient dtype.
        for (float& x : g_values) x = std::clamp(x, -6e4f, 6e4f);
        std::vector<uint8_t> g(n * DTypeSize(grad_dtype));
        ScalarKernels().cast_from_float(g_values.data(), grad_dtype, g.data(), n);
        Moments8 want(n), got(n);
        ScalarKernels().int8.quantize_moments(m0.data(), v0.data(), want.view(), nullptr, n);
        kernels.int8.quantize_moments(m0.data(), v0.data(), got.view(), nullptr, n);
        ASSERT_TRUE(got == want) << "quantize";
        std::vector<float> m_want(n), v_want(n), m_got(n), v_got(n);
        ScalarKernels().int8.dequantize_moments(want.view(), m_want.data(), v_want.data(), n);
        kernels.int8.dequantize_moments(got.view(), m_got.data(), v_got.data(), n);
        ASSERT_TRUE(SameBits(m_want, m_got)) << "dequantize m";
        ASSERT_TRUE(SameBits(v_want, v_got)) << "dequantize v";

        const AdamConstants c =
            MakeAdamConstants(AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, 7, 0.25f);
        std::vector<float> p_got = p;
        std::vector<uint16_t> copy_want(n), copy_got(n);
        const Int8Rounding rounding{Int8RoundingSeed(5, 7), 1000};
        ScalarKernels().int8.adam_update(c, grad_dtype, g.data(), p.data(), want.view(), rounding,
                                         DType::kFp16, copy_want.data(), n);
        kernels.int8.adam_update(c, grad_dtype, g.data(), p_got.data(), got.view(), rounding,
                                 DType::kFp16, copy_got.data(), n);
        ASSERT_TRUE(SameBits(p, p_got)) << "p";
        ASSERT_TRUE(got == want) << "moments";
        ASSERT_TRUE(copy_got == copy_want) << "copy";
      }
    }
  }
}

// 2,000 steps on a separable quadratic whose curvatures span six decades,
// with noisy gradients: 8-bit moments end within 10% of FP32 moments' loss.
TEST_F(Int8AdamTest, LongRunTracksFp32States) {
  const size_t n = 4 * kInt8StateBlock + 77;
  std::vector<float> curvature(n), target(n);
  std::uniform_real_distribution<float> exponent(-6.0f, 0.0f), unit(-1.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    curvature[i] = std::pow(10.0f, exponent(rng_));
    target[i] = unit(rng_);
  }
  std::normal_distribution<float> noise(0.0f, 1e-3f);
  std::vector<float> p32(n, 0.0f), m32(n, 0.0f), v32(n, 0.0f), p8(n, 0.0f), g(n);
  std::vector<float> zeros(n, 0.0f);
  Moments8 moments(n);
  QuantizeMoments(zeros.data(), zeros.data(), moments.view(), n);
  std::vector<uint16_t> copy(n);
  auto loss = [&](const std::vector<float>& p) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
      sum += 0.5 * curvature[i] * (p[i] - target[i]) * (p[i] - target[i]);
    return sum;
  };
  const double initial = loss(p32);
  const AdamConfig config{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, true};
  for (int64_t step = 1; step <= 2000; ++step) {
    const AdamConstants c = MakeAdamConstants(config, step, 1.0f);
    std::vector<float> shared_noise(n);
    for (float& x : shared_noise) x = noise(rng_);
    for (size_t i = 0; i < n; ++i) g[i] = curvature[i] * (p32[i] - target[i]) + shared_noise[i];
    AdamUpdate(c, DType::kFp32, g.data(), p32.data(), m32.data(), v32.data(), DType::kFp16,
               copy.data(), n);
    for (size_t i = 0; i < n; ++i) g[i] = curvature[i] * (p8[i] - target[i]) + shared_noise[i];
    AdamUpdateInt8(c, DType::kFp32, g.data(), p8.data(), moments.view(),
                   Int8Rounding{Int8RoundingSeed(0, step), 0}, DType::kFp16, copy.data(), n);
    for (float x : p8) ASSERT_TRUE(std::isfinite(x)) << "step " << step;
  }
  const double loss32 = loss(p32), loss8 = loss(p8);
  std::printf("loss: initial %.6g, fp32 states %.6g, int8 states %.6g\n", initial, loss32, loss8);
  EXPECT_LT(loss32, 0.1 * initial);
  EXPECT_LT(std::fabs(loss8 - loss32), 0.1 * loss32 + 1e-9 * initial);
}

}  // namespace
}  // namespace strata
