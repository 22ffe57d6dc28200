// The CPU kernels, written once against the Ops interface (scalar_ops.h) and
// instantiated by each instruction-set variant (scalar.cc, avx2.cc,
// avx512.cc) through MakeKernelTable<Ops>(). Vector lanes and the scalar tail
// run the same IEEE operations in the same order, so every variant gives the
// same bits (see the notes on BF16 in avx512.cc).
#ifndef STRATA_KERNELS_CPU_KERNELS_IMPL_H_
#define STRATA_KERNELS_CPU_KERNELS_IMPL_H_

#include <cmath>
#include <cstdint>
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

// Updates elements [i, i + Ops::kWidth). The formula is in adam.h.
// Elements ahead of the one being updated that the vector loop prefetches:
// the arithmetic per element is long enough that the loads alone do not keep
// enough cache misses in flight.
constexpr size_t kAdamPrefetchElements = 512;

template <typename Ops, DType G, DType C, bool kStream>
inline void AdamAt(const AdamVectors<Ops>& k, const void* grads, float* p, float* m, float* v,
                   void* copy, size_t i) {
  using F = typename Ops::F;
  if constexpr (Ops::kWidth > 1) {
    size_t ahead = i + kAdamPrefetchElements;
    __builtin_prefetch(p + ahead, 1);
    __builtin_prefetch(m + ahead, 1);
    __builtin_prefetch(v + ahead, 1);
    __builtin_prefetch(static_cast<const char*>(grads) + ahead * DTypeSize(G));
  }
  F g = Ops::Mul(k.coef, LoadAs<Ops, G>(grads, i));
  F param = Ops::LoadF32(p + i);
  g = Ops::Add(g, Ops::Mul(k.l2, param));
  param = Ops::Mul(param, k.decay);
  F mi = Ops::Add(Ops::Mul(k.beta1, Ops::LoadF32(m + i)), Ops::Mul(k.one_minus_beta1, g));
  F vi =
      Ops::Add(Ops::Mul(k.beta2, Ops::LoadF32(v + i)), Ops::Mul(k.one_minus_beta2, Ops::Mul(g, g)));
  F denom = Ops::Add(Ops::Mul(Ops::Sqrt(vi), k.inv_bias_correction2_sqrt), k.eps);
  param = Ops::Sub(param, Ops::Mul(k.step_size, Ops::Div(mi, denom)));
  Ops::template StoreF32<false>(p + i, param);
  Ops::template StoreF32<false>(m + i, mi);
  Ops::template StoreF32<false>(v + i, vi);
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
void AdamTyped(const AdamConstants& c, const void* grads, float* p, float* m, float* v, void* copy,
               size_t n) {
  const size_t vector_end = n / Ops::kWidth * Ops::kWidth;
  const AdamVectors<Ops> k(c);
  size_t i = 0;
  if (CanStream<Ops, C>(copy, n)) {
    for (; i < vector_end; i += Ops::kWidth) AdamAt<Ops, G, C, true>(k, grads, p, m, v, copy, i);
    Ops::Fence();
  } else {
    for (; i < vector_end; i += Ops::kWidth) AdamAt<Ops, G, C, false>(k, grads, p, m, v, copy, i);
  }
  const AdamVectors<ScalarOps> tail(c);
  for (; i < n; ++i) AdamAt<ScalarOps, G, C, false>(tail, grads, p, m, v, copy, i);
}

template <typename Ops>
void AdamUpdateImpl(const AdamConstants& c, DType grad_dtype, const void* grads, float* p, float* m,
                    float* v, DType copy_dtype, void* copy, size_t n) {
  WithDTypeTag(grad_dtype, [&](auto g) {
    WithDTypeTag(copy_dtype, [&](auto cp) {
      AdamTyped<Ops, decltype(g)::value, decltype(cp)::value>(c, grads, p, m, v, copy, n);
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
    // Prefetch 8 KiB ahead, as the FP16 form does.
    const char* ahead = static_cast<const char*>(base) + (b * kSumLanes * DTypeSize(D) + 8192);
#pragma GCC unroll 4
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

// Blocks summed in FP32: 16 float lanes of 16 squares each.
constexpr size_t kFloatBlock = 256;

// AccumulateSquares for 16-bit gradients at a fraction of the arithmetic:
// the square of an FP16 value is exact in FP32, and so is that of a BF16
// value x with |x| in {0} U [2^-60, 2^60], and 16 of them cannot overflow.
// Float lane j sums the squares of elements kFloatBlock b + 16 q + j for
// q = 0..15 (in that order, fused multiply-adds after the first square;
// relative error at most 15 * 2^-24) and is then added, in double, to
// lanes[j]. A BF16 block with a value outside that range is instead added
// square by square in double, lane j getting q = 0..15 in order. Lanes 16..63
// stay untouched. Every variant takes the same path for a block.
template <typename Ops, DType D>
void AccumulateSquaresInFloat(const void* base, size_t blocks, double* lanes) {
  static_assert(D == DType::kFp16 || D == DType::kBf16);
  constexpr size_t kFloatLanes = 16;
  constexpr size_t kVectors = kFloatLanes / Ops::kWidth;
  constexpr size_t kPerFloatVector = Ops::kWidth / Ops::kDoubleWidth;
  constexpr size_t kAccumulators = kFloatLanes / Ops::kDoubleWidth;
  typename Ops::D acc[kAccumulators];
#pragma GCC unroll 16
  for (size_t k = 0; k < kAccumulators; ++k) acc[k] = Ops::LoadD(lanes + k * Ops::kDoubleWidth);
  for (size_t b = 0; b < blocks; ++b) {
    // Prefetch 8 blocks (4 KiB) ahead: the arithmetic per line is long enough
    // that the loads alone do not keep enough misses in flight.
    const char* ahead = static_cast<const char*>(base) + (b + 8) * kFloatBlock * 2;
#pragma GCC unroll 8
    for (size_t line = 0; line < kFloatBlock * 2; line += 64) __builtin_prefetch(ahead + line);
    bool exact = true;
    typename Ops::F sums[kVectors];
#pragma GCC unroll 16
    for (size_t f = 0; f < kVectors; ++f) {
      typename Ops::F x = LoadAs<Ops, D>(base, b * kFloatBlock + f * Ops::kWidth);
      if constexpr (D == DType::kBf16) exact = exact && Ops::SquareExactInFloat(x);
      sums[f] = Ops::Mul(x, x);
    }
#pragma GCC unroll 15
    for (size_t q = 1; q < kFloatBlock / kFloatLanes; ++q) {
#pragma GCC unroll 16
      for (size_t f = 0; f < kVectors; ++f) {
        typename Ops::F x =
            LoadAs<Ops, D>(base, b * kFloatBlock + q * kFloatLanes + f * Ops::kWidth);
        if constexpr (D == DType::kBf16) exact = exact && Ops::SquareExactInFloat(x);
        sums[f] = Ops::Fma(x, x, sums[f]);
      }
    }
    if (!exact) {
#pragma GCC unroll 16
      for (size_t k = 0; k < kAccumulators; ++k) Ops::StoreD(lanes + k * Ops::kDoubleWidth, acc[k]);
      for (size_t q = 0; q < kFloatBlock / kFloatLanes; ++q) {
        for (size_t j = 0; j < kFloatLanes; ++j) {
          double x = LoadAs<ScalarOps, D>(base, b * kFloatBlock + q * kFloatLanes + j);
          lanes[j] += x * x;
        }
      }
#pragma GCC unroll 16
      for (size_t k = 0; k < kAccumulators; ++k) acc[k] = Ops::LoadD(lanes + k * Ops::kDoubleWidth);
      continue;
    }
#pragma GCC unroll 16
    for (size_t f = 0; f < kVectors; ++f) {
      typename Ops::D d[kPerFloatVector];
      Ops::ToDoubles(sums[f], d);
#pragma GCC unroll 2
      for (size_t h = 0; h < kPerFloatVector; ++h) {
        typename Ops::D& a = acc[f * kPerFloatVector + h];
        a = Ops::AddD(a, d[h]);
      }
    }
  }
#pragma GCC unroll 16
  for (size_t k = 0; k < kAccumulators; ++k) Ops::StoreD(lanes + k * Ops::kDoubleWidth, acc[k]);
}

template <typename Ops>
GradStats GradStatsImpl(DType dtype, const void* grads, size_t n) {
  double lanes[kSumLanes] = {};
  WithDTypeTag(dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    size_t done;
    if constexpr (D != DType::kFp32) {
      AccumulateSquaresInFloat<Ops, D>(grads, n / kFloatBlock, lanes);
      done = n / kFloatBlock * kFloatBlock;
    } else {
      AccumulateSquares<Ops, D>(grads, n / kSumLanes, lanes);
      done = n / kSumLanes * kSumLanes;
    }
    for (size_t i = done, j = 0; i < n; ++i, j = (j + 1) % kSumLanes) {
      double x = LoadAs<ScalarOps, D>(grads, i);
      lanes[j] += x * x;
    }
  });
  GradStats stats;
  stats.sum_squares = ReduceLanes(lanes);
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

template <typename Ops>
KernelTable MakeKernelTable(Isa isa) {
  return KernelTable{isa,
                     &AdamUpdateImpl<Ops>,
                     &GradStatsImpl<Ops>,
                     &CastFromFloatImpl<Ops>,
                     &CastToFloatImpl<Ops>,
                     &AccumulateScaledImpl<Ops>,
                     &AddInPlaceImpl<Ops>};
}

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_KERNELS_IMPL_H_
