// The 8-bit-state kernels of int8_adam.h over the Ops interface, instantiated
// by each instruction-set variant through MakeKernelTable (make_kernel_table.h).
// A block's update keeps its new m and v in two stack arrays (2 KiB, in L1)
// until the block's new scales are known, then codes them: one pass over
// memory. Internal to kernels/.
#ifndef STRATA_KERNELS_CPU_INT8_ADAM_IMPL_H_
#define STRATA_KERNELS_CPU_INT8_ADAM_IMPL_H_

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/int8_codes.h"
#include "kernels/cpu/kernels_impl.h"
#include "kernels/int8_adam.h"

namespace strata {
namespace kernels_internal {
namespace {

// The largest magnitudes of a block's new moments, lane-wise until reduced.
template <typename Ops>
struct BlockLargest {
  typename Ops::F m = Ops::Set(0.0f);
  typename Ops::F v = Ops::Set(0.0f);
};

// Updates element i of the state (vector lanes [i, i + kWidth)): decodes m
// and v, steps, writes p and the copy, keeps the new moments at `at` in
// m_new, v_new.
template <typename Ops, DType G, DType C, bool kStream>
inline void AdamInt8At(const AdamVectors<Ops>& k, const void* grads, float* p, const Int8Moments& s,
                       typename Ops::F m_scale, typename Ops::F v_scale, void* copy, size_t i,
                       float* m_new, float* v_new, size_t at, BlockLargest<Ops>& largest) {
  if constexpr (Ops::kWidth > 1) {
    const size_t ahead = i + kAdamPrefetchElements;
    __builtin_prefetch(p + ahead, 1);
    __builtin_prefetch(s.m + ahead, 1);
    __builtin_prefetch(s.v + ahead, 1);
    __builtin_prefetch(static_cast<const char*>(grads) + ahead * DTypeSize(G));
  }
  typename Ops::F param = Ops::LoadF32(p + i);
  typename Ops::F m = Decode<Ops, MomentCode::kSignedM>(Ops::LoadU8(s.m + i), m_scale);
  typename Ops::F v = Decode<Ops, MomentCode::kUnsignedV>(Ops::LoadU8(s.v + i), v_scale);
  AdamMath<Ops>(k, LoadAs<Ops, G>(grads, i), param, m, v);
  Ops::template StoreF32<false>(p + i, param);
  StoreAs<Ops, C, kStream>(copy, i, param);
  Ops::template StoreF32<false>(m_new + at, m);
  Ops::template StoreF32<false>(v_new + at, v);
  largest.m = Ops::MaxMagnitude(largest.m, m);
  largest.v = Ops::MaxMagnitude(largest.v, v);
}

// Codes m[at], v[at] (vector lanes) into element `at` of `out`; v rounded
// stochastically with the random bits of `index` (element indices, lane by
// lane) when kStochastic, else to nearest.
template <typename Ops, bool kStochastic>
inline void EncodeAt(const float* m, const float* v, typename Ops::F m_inverse,
                     typename Ops::F v_inverse, uint32_t seed, typename Ops::I index,
                     uint8_t* m_out, uint8_t* v_out, size_t at) {
  typename Ops::I m_code =
      Encode<Ops, MomentCode::kSignedM>(Ops::Mul(Ops::LoadF32(m + at), m_inverse));
  const typename Ops::F v_scaled = Ops::Mul(Ops::LoadF32(v + at), v_inverse);
  typename Ops::I v_code;
  if constexpr (kStochastic) {
    v_code = EncodeStochasticV<Ops>(v_scaled, RandomBits<Ops>(seed, index));
  } else {
    v_code = Encode<Ops, MomentCode::kUnsignedV>(v_scaled);
  }
  m_code = Ops::SelectLessI(v_code, Ops::SetI(1), Ops::SetI(0), m_code);
  Ops::StoreU8(m_out + at, m_code);
  Ops::StoreU8(v_out + at, v_code);
}

// EncodeBlock's loops: codes m[0, len) and v[0, len) into m_out, v_out with
// the given scales; element j draws on index rounding.first_index + j.
template <typename Ops, bool kStochastic>
void EncodeBlockAs(const float* m, const float* v, const BlockScale& m_scale,
                   const BlockScale& v_scale, Int8Rounding rounding, uint8_t* m_out, uint8_t* v_out,
                   size_t len) {
  const size_t vector_end = len / Ops::kWidth * Ops::kWidth;
  const typename Ops::F m_inverse = Ops::Set(m_scale.inverse);
  const typename Ops::F v_inverse = Ops::Set(v_scale.inverse);
  typename Ops::I index = Ops::AddI(Ops::SetI(rounding.first_index), Ops::IotaI());
  size_t j = 0;
  for (; j < vector_end; j += Ops::kWidth) {
    EncodeAt<Ops, kStochastic>(m, v, m_inverse, v_inverse, rounding.seed, index, m_out, v_out, j);
    index = Ops::AddI(index, Ops::SetI(Ops::kWidth));
  }
  for (; j < len; ++j) {
    EncodeAt<ScalarOps, kStochastic>(m, v, m_scale.inverse, v_scale.inverse, rounding.seed,
                                     rounding.first_index + static_cast<uint32_t>(j), m_out, v_out,
                                     j);
  }
}

// Codes the moments of block `b`, m[0, len) and v[0, len), from element
// `begin` of the state on, with scales from their largest magnitudes; v
// rounded stochastically with `rounding`, or to nearest without. The codes'
// byte stores may alias anything, so the loops read only locals.
template <typename Ops>
void EncodeBlock(const float* m, const float* v, float m_largest, float v_largest,
                 const Int8Rounding* rounding, const Int8Moments& s, size_t b, size_t begin,
                 size_t len) {
  const BlockScale m_scale = ScaleFor(m_largest), v_scale = ScaleFor(v_largest);
  s.m_scale[b] = m_scale.scale;
  s.v_scale[b] = v_scale.scale;
  if (rounding != nullptr) {
    const Int8Rounding at{rounding->seed, rounding->first_index + static_cast<uint32_t>(begin)};
    EncodeBlockAs<Ops, true>(m, v, m_scale, v_scale, at, s.m + begin, s.v + begin, len);
  } else {
    EncodeBlockAs<Ops, false>(m, v, m_scale, v_scale, Int8Rounding{}, s.m + begin, s.v + begin,
                              len);
  }
}

template <typename Ops, DType G, DType C, bool kStream>
void AdamInt8Block(const AdamVectors<Ops>& k, const AdamVectors<ScalarOps>& tail, const void* grads,
                   float* p, const Int8Moments& s, const Int8Rounding& rounding, void* copy,
                   size_t b, size_t begin, size_t len) {
  alignas(64) float m_new[kInt8StateBlock];
  alignas(64) float v_new[kInt8StateBlock];
  const size_t vector_end = len / Ops::kWidth * Ops::kWidth;
  BlockLargest<Ops> largest;
  const typename Ops::F m_scale = Ops::Set(s.m_scale[b]), v_scale = Ops::Set(s.v_scale[b]);
  size_t j = 0;
  for (; j < vector_end; j += Ops::kWidth) {
    AdamInt8At<Ops, G, C, kStream>(k, grads, p, s, m_scale, v_scale, copy, begin + j, m_new, v_new,
                                   j, largest);
  }
  BlockLargest<ScalarOps> tail_largest{Ops::ReduceMax(largest.m), Ops::ReduceMax(largest.v)};
  for (; j < len; ++j) {
    AdamInt8At<ScalarOps, G, C, false>(tail, grads, p, s, s.m_scale[b], s.v_scale[b], copy,
                                       begin + j, m_new, v_new, j, tail_largest);
  }
  EncodeBlock<Ops>(m_new, v_new, tail_largest.m, tail_largest.v, &rounding, s, b, begin, len);
}

template <typename Ops, DType G, DType C>
void AdamInt8Typed(const AdamConstants& c, const void* grads, float* p, const Int8Moments& s,
                   const Int8Rounding& rounding, void* copy, size_t n) {
  const AdamVectors<Ops> k(c);
  const AdamVectors<ScalarOps> tail(c);
  const bool stream = CanStream<Ops, C>(copy, n);
  for (size_t begin = 0, b = 0; begin < n; begin += kInt8StateBlock, ++b) {
    const size_t len = std::min(kInt8StateBlock, n - begin);
    if (stream) {
      AdamInt8Block<Ops, G, C, true>(k, tail, grads, p, s, rounding, copy, b, begin, len);
    } else {
      AdamInt8Block<Ops, G, C, false>(k, tail, grads, p, s, rounding, copy, b, begin, len);
    }
  }
  if (stream) Ops::Fence();
}

template <typename Ops>
void AdamUpdateInt8Impl(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                        Int8Moments moments, Int8Rounding rounding, DType copy_dtype, void* copy,
                        size_t n) {
  WithDTypeTag(grad_dtype, [&](auto g) {
    WithDTypeTag(copy_dtype, [&](auto cp) {
      AdamInt8Typed<Ops, decltype(g)::value, decltype(cp)::value>(c, grads, p, moments, rounding,
                                                                  copy, n);
    });
  });
}

// The largest magnitude of x[0, len).
template <typename Ops>
float LargestMagnitude(const float* x, size_t len) {
  const size_t vector_end = len / Ops::kWidth * Ops::kWidth;
  typename Ops::F largest = Ops::Set(0.0f);
  size_t j = 0;
  for (; j < vector_end; j += Ops::kWidth) {
    largest = Ops::MaxMagnitude(largest, Ops::LoadF32(x + j));
  }
  float result = Ops::ReduceMax(largest);
  for (; j < len; ++j) result = ScalarOps::MaxMagnitude(result, x[j]);
  return result;
}

template <typename Ops>
void QuantizeMomentsImpl(const float* m, const float* v, Int8Moments out,
                         const Int8Rounding* rounding, size_t n) {
  for (size_t begin = 0, b = 0; begin < n; begin += kInt8StateBlock, ++b) {
    const size_t len = std::min(kInt8StateBlock, n - begin);
    EncodeBlock<Ops>(m + begin, v + begin, LargestMagnitude<Ops>(m + begin, len),
                     LargestMagnitude<Ops>(v + begin, len), rounding, out, b, begin, len);
  }
}

template <typename Ops>
void DequantizeMomentsImpl(const Int8Moments& in, float* m, float* v, size_t n) {
  auto decode = [&](auto ops, size_t i) {
    using O = decltype(ops);
    const size_t b = i / kInt8StateBlock;
    O::template StoreF32<false>(
        m + i, Decode<O, MomentCode::kSignedM>(O::LoadU8(in.m + i), O::Set(in.m_scale[b])));
    O::template StoreF32<false>(
        v + i, Decode<O, MomentCode::kUnsignedV>(O::LoadU8(in.v + i), O::Set(in.v_scale[b])));
  };
  // Vectors never straddle a block: kInt8StateBlock is a multiple of kWidth.
  static_assert(kInt8StateBlock % Ops::kWidth == 0);
  ForEachVector<Ops>(n, decode);
}

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_INT8_ADAM_IMPL_H_
