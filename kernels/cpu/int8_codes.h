// The 8-bit moment codes of int8_adam.h, lane by lane over the Ops interface
// (scalar_ops.h): integer operations on the FP32 bits, so every variant gives
// the same codes and values. Internal to kernels/.
#ifndef STRATA_KERNELS_CPU_INT8_CODES_H_
#define STRATA_KERNELS_CPU_INT8_CODES_H_

#include <cstdint>

#include "kernels/int8_adam.h"

namespace strata {
namespace kernels_internal {

// Which moment a code is of: m (signed E4M3) or v (unsigned E5M3).
enum class MomentCode { kSignedM, kUnsignedV };

namespace {

// The two formats: a code is sign (m only) | exponent << 3 | mantissa; the
// exponent field of a normal code plus kExponentOffset is the FP32 biased
// exponent of its value (1.0 has code exponent kTopExponent, FP32 127).
template <MomentCode K>
struct CodeFormat;
template <>
struct CodeFormat<MomentCode::kSignedM> {
  static constexpr uint32_t kTopExponent = 15;
  static constexpr uint32_t kMaxMagnitude = 127;
  static constexpr bool kSigned = true;
};
template <>
struct CodeFormat<MomentCode::kUnsignedV> {
  static constexpr uint32_t kTopExponent = 31;
  static constexpr uint32_t kMaxMagnitude = 255;
  static constexpr bool kSigned = false;
};

template <MomentCode K>
struct CodeConstants {
  using Format = CodeFormat<K>;
  // FP32 exponent of a code's exponent 0, in the units of a code (<< 3).
  static constexpr uint32_t kOffset = (127 - Format::kTopExponent) << 3;
  // The smallest normal value, 2^(1 - kTopExponent), and the FP32 bits of
  // kMagic, whose ulp is the subnormal step 2^(-2 - kTopExponent): adding a
  // subnormal magnitude to kMagic rounds it to that step, nearest even, and
  // leaves the code in the low bits.
  static constexpr uint32_t kMinNormalBits = (127 + 1 - Format::kTopExponent) << 23;
  static constexpr uint32_t kMagicBits = (127 + 21 - Format::kTopExponent) << 23;
  // The subnormal step, 2^(-2 - kTopExponent).
  static constexpr uint32_t kStepBits = (127 - 2 - Format::kTopExponent) << 23;
};

// |x|, by clearing the sign bit.
template <typename Ops>
inline typename Ops::F Magnitude(typename Ops::F x) {
  return Ops::FromBits(Ops::AndI(Ops::Bits(x), Ops::SetI(0x7fffffffu)));
}

// The code of y (a value of x / scale), rounded to nearest, ties to even.
template <typename Ops, MomentCode K>
inline typename Ops::I Encode(typename Ops::F y) {
  using C = CodeConstants<K>;
  typename Ops::I bits = Ops::Bits(y);
  typename Ops::I magnitude_bits = Ops::AndI(bits, Ops::SetI(0x7fffffffu));
  typename Ops::F magnitude = Ops::FromBits(magnitude_bits);
  // Normal: round the FP32 mantissa to 3 bits (nearest even) on the bits;
  // NaN and Inf land far above the largest code and saturate.
  typename Ops::I lsb = Ops::AndI(Ops::template ShiftRightI<20>(magnitude_bits), Ops::SetI(1));
  typename Ops::I rounded = Ops::AddI(magnitude_bits, Ops::AddI(Ops::SetI(0x7ffffu), lsb));
  typename Ops::I normal =
      Ops::MinI(Ops::SubI(Ops::template ShiftRightI<20>(rounded), Ops::SetI(C::kOffset)),
                Ops::SetI(CodeFormat<K>::kMaxMagnitude));
  typename Ops::I subnormal =
      Ops::SubI(Ops::Bits(Ops::Add(magnitude, Ops::FromBits(Ops::SetI(C::kMagicBits)))),
                Ops::SetI(C::kMagicBits));
  typename Ops::I code =
      Ops::SelectLess(magnitude, Ops::FromBits(Ops::SetI(C::kMinNormalBits)), subnormal, normal);
  if constexpr (CodeFormat<K>::kSigned) {
    code = Ops::OrI(code, Ops::template ShiftRightI<24>(Ops::AndI(bits, Ops::SetI(0x80000000u))));
  }
  return code;
}

template <typename Ops, int k>
inline typename Ops::I XorShift(typename Ops::I x) {
  return Ops::XorI(x, Ops::template ShiftRightI<k>(x));
}

// 32 random bits per lane: the lowbias32 hash (C. Wellons) of seed ^ index.
template <typename Ops>
inline typename Ops::I RandomBits(uint32_t seed, typename Ops::I index) {
  typename Ops::I x = Ops::XorI(index, Ops::SetI(seed));
  x = Ops::MulI(XorShift<Ops, 16>(x), Ops::SetI(0x7feb352du));
  x = Ops::MulI(XorShift<Ops, 15>(x), Ops::SetI(0x846ca68bu));
  return XorShift<Ops, 16>(x);
}

// v's code of y rounded up with probability (y - lower) / (upper - lower).
// The code is the FP32 bits of y * 2^(top - 127) >> 20: the factor puts the
// format's smallest normal at FP32's, so that normal and subnormal codes
// alike are those top bits, and adding 20 random bits below the cut rounds
// stochastically. The product is formed without FP32 denormals (on x86 each
// costs a microcode assist, about a hundred cycles, per vector): at or above
// the smallest normal code it is y's bits less (127 - top) << 23; below, it
// is a denormal whose bits are y * 2^(149 - (127 - top)) rounded to an
// integer, nearest even, as adding 2^23 to that exact product rounds it.
template <typename Ops>
inline typename Ops::I EncodeStochasticV(typename Ops::F y, typename Ops::I random) {
  constexpr uint32_t kTop = CodeFormat<MomentCode::kUnsignedV>::kTopExponent;
  constexpr uint32_t kMinNormalBits = CodeConstants<MomentCode::kUnsignedV>::kMinNormalBits;
  constexpr uint32_t kToDenormalBits = (127 + 149 - (127 - kTop)) << 23;
  constexpr uint32_t kRoundingBits = (127 + 23) << 23;
  const typename Ops::F magnitude = Magnitude<Ops>(y);
  const typename Ops::I normal = Ops::SubI(Ops::Bits(magnitude), Ops::SetI((127 - kTop) << 23));
  const typename Ops::I denormal =
      Ops::SubI(Ops::Bits(Ops::Add(Ops::Mul(magnitude, Ops::FromBits(Ops::SetI(kToDenormalBits))),
                                   Ops::FromBits(Ops::SetI(kRoundingBits)))),
                Ops::SetI(kRoundingBits));
  const typename Ops::I aligned =
      Ops::SelectLess(magnitude, Ops::FromBits(Ops::SetI(kMinNormalBits)), denormal, normal);
  const typename Ops::I code =
      Ops::template ShiftRightI<20>(Ops::AddI(aligned, Ops::template ShiftRightI<12>(random)));
  return Ops::MinI(code, Ops::SetI(CodeFormat<MomentCode::kUnsignedV>::kMaxMagnitude));
}

// The value of `code` times `scale`.
template <typename Ops, MomentCode K>
inline typename Ops::F Decode(typename Ops::I code, typename Ops::F scale) {
  using C = CodeConstants<K>;
  typename Ops::I magnitude = Ops::AndI(code, Ops::SetI(CodeFormat<K>::kMaxMagnitude));
  typename Ops::I normal =
      Ops::template ShiftLeftI<20>(Ops::AddI(magnitude, Ops::SetI(C::kOffset)));
  typename Ops::I subnormal =
      Ops::Bits(Ops::Mul(Ops::ToFloat(magnitude), Ops::FromBits(Ops::SetI(C::kStepBits))));
  typename Ops::I bits = Ops::SelectLessI(magnitude, Ops::SetI(8), subnormal, normal);
  if constexpr (CodeFormat<K>::kSigned) {
    bits = Ops::OrI(bits, Ops::template ShiftLeftI<24>(Ops::AndI(code, Ops::SetI(0x80))));
  }
  return Ops::Mul(Ops::FromBits(bits), scale);
}

// The scale of a block whose largest magnitude is `largest`, and the factor
// that maps its values to codes: 0 and 0 below FLT_MIN (the block is zeros).
struct BlockScale {
  float scale;
  float inverse;
};
inline BlockScale ScaleFor(float largest) {
  if (!(largest >= 0x1p-126f)) return {0.0f, 0.0f};
  return {largest, 1.0f / largest};
}

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_INT8_CODES_H_
