// The AVX2 + F16C + FMA variant (compiled with -mavx2 -mf16c -mfma; run
// only where CPUID reports all three). FP16 conversions use F16C (round to nearest even, IEEE
// overflow to Inf); BF16 rounding is done on the integer bits exactly as the
// scalar FloatToBf16 does, so every output equals the scalar variant's.
#include <immintrin.h>

#include "kernels/cpu/make_kernel_table.h"

namespace strata {
namespace kernels_internal {
namespace {

struct Avx2Ops {
  static constexpr size_t kWidth = 8;
  using F = __m256;
  static F Set(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static bool AllFinite(F x) {
    F magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    // Ordered: a NaN lane compares false.
    F finite = _mm256_cmp_ps(magnitude, _mm256_set1_ps(0x1.fffffep127f), _CMP_LE_OQ);
    return _mm256_movemask_ps(finite) == 0xff;
  }
  static F LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBf16(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static void LoadBf16Pairs(const uint16_t* p, F* even, F* odd) {
    __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff0000)));
  }
  template <bool kStream>
  static void StoreF32(float* p, F x) {
    if constexpr (kStream) {
      _mm256_stream_ps(p, x);
    } else {
      _mm256_storeu_ps(p, x);
    }
  }
  template <bool kStream>
  static void Store128(uint16_t* p, __m128i h) {
    if constexpr (kStream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    }
  }
  template <bool kStream>
  static void StoreF16(uint16_t* p, F x) {
    Store128<kStream>(p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  template <bool kStream>
  static void StoreBf16(uint16_t* p, F x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    Store128<kStream>(
        p, _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1)));
  }
  static void Fence() { _mm_sfence(); }
  static constexpr size_t kDoubleWidth = 4;
  using D = __m256d;
  static D LoadD(const double* p) { return _mm256_loadu_pd(p); }
  static void StoreD(double* p, D x) { _mm256_storeu_pd(p, x); }
  static D AddD(D a, D b) { return _mm256_add_pd(a, b); }
  static D MulD(D a, D b) { return _mm256_mul_pd(a, b); }
  static void ToDoubles(F x, D* out) {
    out[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    out[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  }
  using I = __m256i;
  static I SetI(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static I AddI(I a, I b) { return _mm256_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I MulI(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I IotaI() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static I AndI(I a, I b) { return _mm256_and_si256(a, b); }
  static I OrI(I a, I b) { return _mm256_or_si256(a, b); }
  static I XorI(I a, I b) { return _mm256_xor_si256(a, b); }
  template <int k>
  static I ShiftRightI(I a) {
    return _mm256_srli_epi32(a, k);
  }
  template <int k>
  static I ShiftLeftI(I a) {
    return _mm256_slli_epi32(a, k);
  }
  static I MinI(I a, I b) { return _mm256_min_epu32(a, b); }
  static I Bits(F x) { return _mm256_castps_si256(x); }
  static F FromBits(I x) { return _mm256_castsi256_ps(x); }
  static F ToFloat(I x) { return _mm256_cvtepi32_ps(x); }
  static I SelectLess(F a, F b, I x, I y) {
    return _mm256_blendv_epi8(y, x, _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ)));
  }
  static I SelectLessI(I a, I b, I x, I y) {
    return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi32(b, a));
  }
  static F MaxMagnitude(F a, F x) {
    return _mm256_max_ps(a, _mm256_and_ps(x, _mm256_castsi256_ps(SetI(0x7fffffffu))));
  }
  static float ReduceMax(F x) {
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
  }
  static I LoadU8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreU8(uint8_t* p, I x) {
    __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
  }
};

}  // namespace
}  // namespace kernels_internal

const KernelTable& Avx2Kernels() {
  static const KernelTable table =
      kernels_internal::MakeKernelTable<kernels_internal::Avx2Ops>(Isa::kAvx2);
  return table;
}

}  // namespace strata
