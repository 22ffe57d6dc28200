// 8-bit Adam moments: the state format of jobs with `state_precision` int8,
// and the fused AdamW update over it. Pure functions over caller-owned
// memory; thread-safe for disjoint ranges.
//
// Format. m and v are stored one byte per parameter, block-wise: each block
// of kInt8StateBlock consecutive parameters (from the start of the state;
// the last block may be shorter) has one FP32 scale per moment, the largest
// magnitude in the block, and each byte codes x / scale in a small float
// format (a documented variant of the dynamic quantization of 8-bit Adam,
// Dettmers et al. 2022: dynamic exponent, computed without a code book):
//   m, signed E4M3:   bit 7 sign; bits 6..3 exponent e; bits 2..0 mantissa f.
//                     e > 0: 2^(e-15) (1 + f/8); e = 0: f 2^-17. So 1.0 is
//                     0x78, the range reaches 2^-17 of the block's largest.
//   v, unsigned E5M3: bits 7..3 exponent e; bits 2..0 mantissa f.
//                     e > 0: 2^(e-31) (1 + f/8); e = 0: f 2^-33.
// Encoding computes y = x * (1 / scale) in FP32. QuantizeMoments rounds y
// to the nearest code, ties to the even code. AdamUpdateInt8 does so for m
// and rounds v stochastically: up with probability (y - lower) / (upper -
// lower), from 20 bits of a counter-based hash of (seed, element index), so
// the same step gives the same bits anywhere. (v's moving average changes by
// 1 - beta2, 0.1%, a step: less than half a code step, so rounding to
// nearest would hold each v still until its block's scale moves, and a
// noisy quadratic then ends at twice the loss of FP32 states; see
// tests/unit/int8_adam_test.cc.) NaN and values beyond the largest code
// saturate. A block whose largest magnitude is below FLT_MIN is all zeros
// with scale 0. An element whose v codes to 0 gets m = 0 too, so that
// m / (sqrt(v) + eps) never divides a surviving m by eps alone.
// Relative error of a coded value: at most 2^-4 within the normal range.
//
// The update (AdamUpdateInt8) decodes m and v, applies the step of adam.h in
// FP32 (the same operations in the same order), writes p and its
// low-precision copy, then codes the new m and v with the block's new
// scales: one pass over memory. The scalar, AVX2 and AVX-512 variants (and
// CUDA) give the same bits for finite inputs; with non-finite gradients
// (which the server never applies: see grad_stats.h) the outputs are
// unspecified.
#ifndef STRATA_KERNELS_INT8_ADAM_H_
#define STRATA_KERNELS_INT8_ADAM_H_

#include <cstddef>
#include <cstdint>

#include "core/chunk_bytes.h"
#include "kernels/adam.h"
#include "strata/types.h"

namespace strata {

// The moments of one range of an 8-bit state, starting at a block
// boundary: m[i], v[i] for its elements and m_scale[b], v_scale[b] for its
// blocks.
struct Int8Moments {
  uint8_t* m;
  float* m_scale;
  uint8_t* v;
  float* v_scale;
};

// What v's stochastic rounding draws on: element i of a range has index
// first_index + i (the low 32 bits of its place in the model, so that a
// range updated piece by piece, or cut into chunks another way, rounds as it
// would whole).
struct Int8Rounding {
  uint32_t seed;
  uint32_t first_index;
};

// The seed of one step of the parameters whose place in the model, shifted
// right by 32 bits, is `window` (first_index then holds the low 32 bits):
// every copy and every chunking of a model rounds a step alike.
uint32_t Int8RoundingSeed(uint64_t window, int64_t step);

// In place. `n` ends at a block boundary or at the end of the state (the
// last block's scale covers only the elements it has). `grads` may lie at
// any address.
void AdamUpdateInt8(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                    Int8Moments moments, Int8Rounding rounding, DType copy_dtype, void* copy,
                    size_t n);

// The codes and scales of FP32 moments m[0, n), v[0, n), as AdamUpdateInt8
// would store them (m = 0 where v codes to 0 included).
void QuantizeMoments(const float* m, const float* v, Int8Moments out, size_t n);
// The same with v rounded stochastically as AdamUpdateInt8 rounds it: a
// step's new moments computed apart (a block whose parameters take
// different constants) are stored with the bits AdamUpdateInt8 would give.
// `out` and `rounding` start at a block boundary.
void QuantizeMomentsRounded(const float* m, const float* v, Int8Moments out, Int8Rounding rounding,
                            size_t n);
// The FP32 values of n coded moments.
void DequantizeMoments(const Int8Moments& in, float* m, float* v, size_t n);

}  // namespace strata

#endif  // STRATA_KERNELS_INT8_ADAM_H_
