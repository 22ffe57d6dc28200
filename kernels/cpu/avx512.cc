// The AVX-512 variant (compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -mavx512bf16; run only where CPUID reports all of them).
//
// BF16 stores use VCVTNEPS2BF16, which rounds to nearest even like the scalar
// FloatToBf16 but treats FP32 denormal inputs as zero: for |x| < 2^-126 it
// writes ±0 where the scalar variant writes the nearest BF16 denormal (a
// difference below 2^-126), and NaN payloads may differ (both are NaN). Every
// other output equals the scalar variant's bit for bit.
//
// The 8-bit-state kernels (int8_adam.h) are 16 lanes wide too, their codes
// integer operations on the FP32 bits, bitwise equal to the scalar
// variant's.
#include <immintrin.h>

#include "kernels/cpu/make_kernel_table.h"

namespace strata {
namespace kernels_internal {
namespace {

struct Avx512Ops {
  static constexpr size_t kWidth = 16;
  using F = __m512;
  static F Set(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static bool AllFinite(F x) {
    // fpclass 0x99: QNaN, +Inf, -Inf or SNaN.
    return _mm512_fpclass_ps_mask(x, 0x99) == 0;
  }
  static F LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBf16(const uint16_t* p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static void LoadBf16Pairs(const uint16_t* p, F* even, F* odd) {
    __m512i pairs = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(0xffff0000)));
  }
  template <bool kStream>
  static void StoreF32(float* p, F x) {
    if constexpr (kStream) {
      _mm512_stream_ps(p, x);
    } else {
      _mm512_storeu_ps(p, x);
    }
  }
  template <bool kStream>
  static void Store256(uint16_t* p, __m256i h) {
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    }
  }
  template <bool kStream>
  static void StoreF16(uint16_t* p, F x) {
    Store256<kStream>(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  template <bool kStream>
  static void StoreBf16(uint16_t* p, F x) {
    __m256bh h = _mm512_cvtneps_pbh(x);
    Store256<kStream>(p, reinterpret_cast<__m256i&>(h));
  }
  static void Fence() { _mm_sfence(); }
  static constexpr size_t kDoubleWidth = 8;
  using D = __m512d;
  static D LoadD(const double* p) { return _mm512_loadu_pd(p); }
  static void StoreD(double* p, D x) { _mm512_storeu_pd(p, x); }
  static D AddD(D a, D b) { return _mm512_add_pd(a, b); }
  static D MulD(D a, D b) { return _mm512_mul_pd(a, b); }
  static void ToDoubles(F x, D* out) {
    out[0] = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    out[1] = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  }
  using I = __m512i;
  static I SetI(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static I AddI(I a, I b) { return _mm512_add_epi32(a, b); }
  static I SubI(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I MulI(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I IotaI() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static I AndI(I a, I b) { return _mm512_and_si512(a, b); }
  static I OrI(I a, I b) { return _mm512_or_si512(a, b); }
  static I XorI(I a, I b) { return _mm512_xor_si512(a, b); }
  template <int k>
  static I ShiftRightI(I a) {
    return _mm512_srli_epi32(a, k);
  }
  template <int k>
  static I ShiftLeftI(I a) {
    return _mm512_slli_epi32(a, k);
  }
  static I MinI(I a, I b) { return _mm512_min_epu32(a, b); }
  static I Bits(F x) { return _mm512_castps_si512(x); }
  static F FromBits(I x) { return _mm512_castsi512_ps(x); }
  static F ToFloat(I x) { return _mm512_cvtepi32_ps(x); }
  static I SelectLess(F a, F b, I x, I y) {
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
  }
  static I SelectLessI(I a, I b, I x, I y) {
    return _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(a, b), y, x);
  }
  // VRANGEPS 0b1011: the operand of larger magnitude, its sign cleared.
  static F MaxMagnitude(F a, F x) { return _mm512_range_ps(a, x, 0b1011); }
  static float ReduceMax(F x) {
    __m256 lower = _mm512_castps512_ps256(x);
    __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    __m256 eight = _mm256_max_ps(lower, upper);
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
  }
  static I LoadU8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreU8(uint8_t* p, I x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(x));
  }
};

}  // namespace
}  // namespace kernels_internal

const KernelTable& Avx512Kernels() {
  static const KernelTable table =
      kernels_internal::MakeKernelTable<kernels_internal::Avx512Ops>(Isa::kAvx512);
  return table;
}

}  // namespace strata
