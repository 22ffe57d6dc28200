// The CPU kernels, written once against the Ops interface (scalar_ops.h) and
// instantiated by each instruction-set variant (scalar.cc, avx2.cc,
// avx512.cc) through MakeKernelTable<Ops>() (make_kernel_table.h). Vector
// lanes and the scalar tail run the same IEEE operations in the same order,
// so every variant gives the same bits (see the notes on BF16 in avx512.cc).
#ifndef STRATA_KERNELS_CPU_KERNELS_IMPL_H_
#define STRATA_KERNELS_CPU_KERNELS_IMPL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/cpu/scalar_ops.h"

namespace strata {
namespace kernels_internal {
namespace {

// Streaming (non-temporal) stores for outputs of at least this many bytes:
// the low-precision copy is not read again soon, and streaming it saves the
// read-for-ownership traffic.
constexpr size_t kStreamMinBytes = size_t{1} << 20;

template <typename Ops>
struct AdamVectors {
  explicit AdamVectors(const AdamConstants& c)
      : coef(Ops::Set(c.coef)),
        l2(Ops::Set(c.l2)),
        decay(Ops::Set(c.decay)),
        beta1(Ops::Set(c.beta1)),
        one_minus_beta1(Ops::Set(c.one_minus_beta1)),
        beta2(Ops::Set(c.beta2)),
        one_minus_beta2(Ops::Set(c.one_minus_beta2)),
        inv_bias_correction2_sqrt(Ops::Set(c.inv_bias_correction2_sqrt)),
        eps(Ops::Set(c.eps)),
        step_size(Ops::Set(c.step_size)) {}
  typename Ops::F coef, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
      inv_bias_correction2_sqrt, eps, step_size;
};

// The formula of adam.h on loaded lanes: `grad` as stored (coef not yet
// applied); param, m and v in, their updates out.
template <typename Ops>
inline void AdamMath(const AdamVectors<Ops>& k, typename Ops::F grad, typename Ops::F& param,
                     typename Ops::F& m, typename Ops::F& v) {
  typename Ops::F g = Ops::Mul(k.coef, grad);
  g = Ops::Add(g, Ops::Mul(k.l2, param));
  param = Ops::Mul(param, k.decay);
  m = Ops::Add(Ops::Mul(k.beta1, m), Ops::Mul(k.one_minus_beta1, g));
  v = Ops::Add(Ops::Mul(k.beta2, v), Ops::Mul(k.one_minus_beta2, Ops::Mul(g, g)));
  typename Ops::F denom = Ops::Add(Ops::Mul(Ops::Sqrt(v), k.inv_bias_correction2_sqrt), k.eps);
  param = Ops::Sub(param, Ops::Mul(k.step_size, Ops::Div(m, denom)));
}

// Updates elements [i, i + Ops::kWidth). The formula is in adam.h.
// Elements ahead of the one being updated that the vector loop prefetches:
// the arithmetic per element is long enough that the loads alone do not keep
// enough cache misses in flight.
constexpr size_t kAdamPrefetchElements = 512;

template <typename Ops, DType G, DType C, bool kStream>
inline void AdamAt(const AdamVectors<Ops>& k, const void* grads, const AdamInputs& in,
                   const AdamOutputs& out, void* copy, size_t i) {
  using F = typename Ops::F;
  if constexpr (Ops::kWidth > 1) {
    size_t ahead = i + kAdamPrefetchElements;
    __builtin_prefetch(in.p + ahead, 1);
    __builtin_prefetch(in.m + ahead, 1);
    __builtin_prefetch(in.v + ahead, 1);
    __builtin_prefetch(static_cast<const char*>(grads) + ahead * DTypeSize(G));
  }
  F param = Ops::LoadF32(in.p + i);
  F mi = Ops::LoadF32(in.m + i);
  F vi = Ops::LoadF32(in.v + i);
  AdamMath<Ops>(k, LoadAs<Ops, G>(grads, i), param, mi, vi);
  Ops::template StoreF32<false>(out.p + i, param);
  Ops::template StoreF32<false>(out.m + i, mi);
  Ops::template StoreF32<false>(out.v + i, vi);
  StoreAs<Ops, C, kStream>(copy, i, param);
}

// Whether the vector loop may stream `n` outputs of dtype C to `out`.
template <typename Ops, DType C>
bool CanStream(const void* out, size_t n) {
  size_t vector_bytes = Ops::kWidth * DTypeSize(C);
  return Ops::kWidth > 1 && n * DTypeSize(C) >= kStreamMinBytes &&
         reinterpret_cast<uintptr_t>(out) % vector_bytes == 0;
}

template <typename Ops, DType G, DType C>
void AdamTyped(const AdamConstants& c, const void* grads, const AdamInputs& in,
               const AdamOutputs& out, void* copy, size_t n) {
  const size_t vector_end = n / Ops::kWidth * Ops::kWidth;
  const AdamVectors<Ops> k(c);
  size_t i = 0;
  if (CanStream<Ops, C>(copy, n)) {
    for (; i < vector_end; i += Ops::kWidth) AdamAt<Ops, G, C, true>(k, grads, in, out, copy, i);
    Ops::Fence();
  } else {
    for (; i < vector_end; i += Ops::kWidth) AdamAt<Ops, G, C, false>(k, grads, in, out, copy, i);
  }
  const AdamVectors<ScalarOps> tail(c);
  for (; i < n; ++i) AdamAt<ScalarOps, G, C, false>(tail, grads, in, out, copy, i);
}

template <typename Ops>
void AdamUpdateImpl(const AdamConstants& c, DType grad_dtype, const void* grads, AdamInputs in,
                    AdamOutputs out, DType copy_dtype, void* copy, size_t n) {
  WithDTypeTag(grad_dtype, [&](auto g) {
    WithDTypeTag(copy_dtype, [&](auto cp) {
      AdamTyped<Ops, decltype(g)::value, decltype(cp)::value>(c, grads, in, out, copy, n);
    });
  });
}

// Adds element kSumLanes b + j squared, in double, to lanes[j] for each of
// `blocks` blocks; one accumulator vector per kDoubleWidth lanes.
template <typename Ops, DType D>
void AccumulateSquares(const void* base, size_t blocks, double* lanes) {
  constexpr size_t kPerFloatVector = Ops::kWidth / Ops::kDoubleWidth;
  constexpr size_t kAccumulators = kSumLanes / Ops::kDoubleWidth;
  // Unrolled completely so that the accumulators live in registers.
  typename Ops::D acc[kAccumulators];
#pragma GCC unroll 64
  for (size_t k = 0; k < kAccumulators; ++k) acc[k] = Ops::LoadD(lanes + k * Ops::kDoubleWidth);
  for (size_t b = 0; b < blocks; ++b) {
    // Prefetch 8 KiB ahead: the conversions to double are long enough that
    // the loads alone do not keep enough misses in flight.
    const char* ahead = static_cast<const char*>(base) + (b * kSumLanes * DTypeSize(D) + 8192);
    for (size_t line = 0; line < kSumLanes * DTypeSize(D); line += 64) {
      __builtin_prefetch(ahead + line);
    }
#pragma GCC unroll 64
    for (size_t f = 0; f < kSumLanes / Ops::kWidth; ++f) {
      typename Ops::D d[kPerFloatVector];
      Ops::ToDoubles(LoadAs<Ops, D>(base, b * kSumLanes + f * Ops::kWidth), d);
#pragma GCC unroll 2
      for (size_t h = 0; h < kPerFloatVector; ++h) {
        typename Ops::D& a = acc[f * kPerFloatVector + h];
        a = Ops::AddD(a, Ops::MulD(d[h], d[h]));
      }
    }
  }
#pragma GCC unroll 64
  for (size_t k = 0; k < kAccumulators; ++k) Ops::StoreD(lanes + k * Ops::kDoubleWidth, acc[k]);
}

// Adds elements [begin, n) squared, in double, to lanes 0, 1, ... in turn.
template <DType D>
void AddTailSquares(const void* base, size_t begin, size_t n, double* lanes) {
  for (size_t i = begin, j = 0; i < n; ++i, j = (j + 1) % kSumLanes) {
    double x = LoadAs<ScalarOps, D>(base, i);
    lanes[j] += x * x;
  }
}

// The first pass of the sum of squares works in FP32, on blocks of
// kSquareRows rows of kFloatLanes elements: float lane j sums the squares of
// the element at RowOffset<D>(j) of rows q = 0..7 (a product for q = 0, then
// fused multiply-adds), and the block's lane sums are added, in double, to
// lanes[j]. Lanes kFloatLanes..63 stay untouched.
inline constexpr size_t kFloatLanes = 32;
inline constexpr size_t kSquareRows = 8;
inline constexpr size_t kSquareBlock = kFloatLanes * kSquareRows;

// The element of a row that float lane j sums: element j, except for BF16,
// whose lanes 0..15 take the even elements and lanes 16..31 the odd ones --
// what widening pairs of BF16 values by a shift and a mask gives, with no
// shuffle.
template <DType D>
constexpr size_t RowOffset(size_t lane) {
  if constexpr (D != DType::kBf16) return lane;
  return lane < kFloatLanes / 2 ? 2 * lane : 2 * (lane - kFloatLanes / 2) + 1;
}

// Loads the row that starts at element `row` into kFloatLanes / kWidth
// vectors, vector k holding float lanes [k kWidth, (k + 1) kWidth).
template <typename Ops, DType D>
inline void LoadRow(const void* base, size_t row, typename Ops::F* x) {
  constexpr size_t kVectors = kFloatLanes / Ops::kWidth;
  if constexpr (D == DType::kBf16) {
#pragma GCC unroll 16
    for (size_t h = 0; h < kVectors / 2; ++h) {
      Ops::LoadBf16Pairs(static_cast<const uint16_t*>(base) + row + 2 * Ops::kWidth * h, &x[h],
                         &x[kVectors / 2 + h]);
    }
  } else {
#pragma GCC unroll 32
    for (size_t k = 0; k < kVectors; ++k) x[k] = LoadAs<Ops, D>(base, row + k * Ops::kWidth);
  }
}

// Bytes ahead of the block being summed that the FP32 pass prefetches.
constexpr size_t kSquaresPrefetchBytes = 4096;

// The FP32 pass over `blocks` blocks. Squares of FP16 values are exact in
// FP32, and so are those of BF16 values that neither overflow nor go below
// 2^-149; FP32 squares round once. So a lane sum's relative error is at most
// 8 * 2^-24, with an absolute error of at most 8 * 2^-150 for squares too
// small for FP32 (GradStatsImpl makes those irrelevant). A block with a lane
// sum that is not finite (an element is Inf or NaN, or a square overflows
// FP32) is summed instead square by square in double, lane j getting rows
// q = 0..7 in order. Every variant takes the same path for a block.
template <typename Ops, DType D>
void AccumulateSquaresInFloat(const void* base, size_t blocks, double* lanes) {
  constexpr size_t kVectors = kFloatLanes / Ops::kWidth;
  constexpr size_t kPerFloatVector = Ops::kWidth / Ops::kDoubleWidth;
  constexpr size_t kAccumulators = kFloatLanes / Ops::kDoubleWidth;
  constexpr size_t kBlockBytes = kSquareBlock * DTypeSize(D);
  typename Ops::D acc[kAccumulators];
#pragma GCC unroll 32
  for (size_t k = 0; k < kAccumulators; ++k) acc[k] = Ops::LoadD(lanes + k * Ops::kDoubleWidth);
  for (size_t b = 0; b < blocks; ++b) {
    const char* ahead = static_cast<const char*>(base) + b * kBlockBytes + kSquaresPrefetchBytes;
#pragma GCC unroll 16
    for (size_t line = 0; line < kBlockBytes; line += 64) __builtin_prefetch(ahead + line);
    typename Ops::F x[kVectors], sums[kVectors];
    LoadRow<Ops, D>(base, b * kSquareBlock, x);
#pragma GCC unroll 32
    for (size_t k = 0; k < kVectors; ++k) sums[k] = Ops::Mul(x[k], x[k]);
#pragma GCC unroll 7
    for (size_t q = 1; q < kSquareRows; ++q) {
      LoadRow<Ops, D>(base, b * kSquareBlock + q * kFloatLanes, x);
#pragma GCC unroll 32
      for (size_t k = 0; k < kVectors; ++k) sums[k] = Ops::Fma(x[k], x[k], sums[k]);
    }
    bool finite = true;
#pragma GCC unroll 32
    for (size_t k = 0; k < kVectors; ++k) finite = finite && Ops::AllFinite(sums[k]);
    if (!finite) {
#pragma GCC unroll 32
      for (size_t k = 0; k < kAccumulators; ++k) Ops::StoreD(lanes + k * Ops::kDoubleWidth, acc[k]);
      for (size_t q = 0; q < kSquareRows; ++q) {
        for (size_t j = 0; j < kFloatLanes; ++j) {
          double e =
              LoadAs<ScalarOps, D>(base, b * kSquareBlock + q * kFloatLanes + RowOffset<D>(j));
          lanes[j] += e * e;
        }
      }
#pragma GCC unroll 32
      for (size_t k = 0; k < kAccumulators; ++k) acc[k] = Ops::LoadD(lanes + k * Ops::kDoubleWidth);
      continue;
    }
#pragma GCC unroll 32
    for (size_t k = 0; k < kVectors; ++k) {
      typename Ops::D d[kPerFloatVector];
      Ops::ToDoubles(sums[k], d);
#pragma GCC unroll 2
      for (size_t h = 0; h < kPerFloatVector; ++h) {
        typename Ops::D& a = acc[k * kPerFloatVector + h];
        a = Ops::AddD(a, d[h]);
      }
    }
  }
#pragma GCC unroll 32
  for (size_t k = 0; k < kAccumulators; ++k) Ops::StoreD(lanes + k * Ops::kDoubleWidth, acc[k]);
}

// A sum of squares below this is computed again in double, square by square:
// the squares the FP32 pass lost (each below 2^-149, at most n of them) are
// then below 2^-30 of the sum for any n up to 2^40.
constexpr double kTinySumOfSquares = 0x1p-80;

template <typename Ops>
GradStats GradStatsImpl(DType dtype, const void* grads, size_t n) {
  GradStats stats;
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    double lanes[kSumLanes] = {};
    AccumulateSquaresInFloat<Ops, D>(grads, n / kSquareBlock, lanes);
    AddTailSquares<D>(grads, n / kSquareBlock * kSquareBlock, n, lanes);
    stats.sum_squares = ReduceLanes(lanes);
    if (stats.sum_squares < kTinySumOfSquares) {
      std::fill(std::begin(lanes), std::end(lanes), 0.0);
      AccumulateSquares<Ops, D>(grads, n / kSumLanes, lanes);
      AddTailSquares<D>(grads, n / kSumLanes * kSumLanes, n, lanes);
      stats.sum_squares = ReduceLanes(lanes);
    }
  });
  // Squares of finite floats, summed in double, cannot overflow: the sum is
  // finite exactly when every element is.
  stats.all_finite = std::isfinite(stats.sum_squares);
  return stats;
}

// Applies out = op(in...) elementwise over n elements: vector body, scalar
// tail. `body(OpsTag, i)` handles elements [i, i + width).
template <typename Ops, typename Body>
void ForEachVector(size_t n, Body&& body) {
  const size_t vector_end = n / Ops::kWidth * Ops::kWidth;
  size_t i = 0;
  for (; i < vector_end; i += Ops::kWidth) body(Ops{}, i);
  for (; i < n; ++i) body(ScalarOps{}, i);
}

// Casts write an output they do not read: streamed when it is large and
// aligned (CanStream), which saves the read-for-ownership traffic.
template <typename Ops>
void CastFromFloatImpl(const float* from, DType dtype, void* to, size_t n) {
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    auto cast = [&](auto stream) {
      ForEachVector<Ops>(n, [&](auto ops, size_t i) {
        using O = decltype(ops);
        StoreAs<O, D, decltype(stream)::value && O::kWidth != 1>(to, i, O::LoadF32(from + i));
      });
    };
    if (CanStream<Ops, D>(to, n)) {
      cast(std::true_type{});
      Ops::Fence();
    } else {
      cast(std::false_type{});
    }
  });
}

template <typename Ops>
void CastToFloatImpl(DType dtype, const void* from, float* to, size_t n) {
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    auto cast = [&](auto stream) {
      ForEachVector<Ops>(n, [&](auto ops, size_t i) {
        using O = decltype(ops);
        StoreAs<O, DType::kFp32, decltype(stream)::value && O::kWidth != 1>(to, i,
                                                                            LoadAs<O, D>(from, i));
      });
    };
    if (CanStream<Ops, DType::kFp32>(to, n)) {
      cast(std::true_type{});
      Ops::Fence();
    } else {
      cast(std::false_type{});
    }
  });
}

template <typename Ops>
void AccumulateScaledImpl(DType dtype, const float* x, float scale, void* acc, size_t n) {
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    ForEachVector<Ops>(n, [&](auto ops, size_t i) {
      using O = decltype(ops);
      StoreAs<O, D>(acc, i, O::Add(LoadAs<O, D>(acc, i), O::Mul(O::Set(scale), O::LoadF32(x + i))));
    });
  });
}

template <typename Ops>
void AddInPlaceImpl(DType dtype, const void* x, void* acc, size_t n) {
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    ForEachVector<Ops>(n, [&](auto ops, size_t i) {
      using O = decltype(ops);
      StoreAs<O, D>(acc, i, O::Add(LoadAs<O, D>(acc, i), LoadAs<O, D>(x, i)));
    });
  });
}

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_KERNELS_IMPL_H_
