// StateShape: the size and precision of one chunk's state, laid out as
// core/chunk_bytes.h says (p, then m and v in FP32 or as 8-bit codes with
// block scales); StateView: pointers into one such buffer. Values; no
// thread-safety concerns.
#ifndef STRATA_SHARD_STATE_VIEW_H_
#define STRATA_SHARD_STATE_VIEW_H_

#include <cstddef>
#include <cstdint>

#include "core/chunk_bytes.h"
#include "kernels/int8_adam.h"
#include "strata/types.h"

namespace strata {

// The state of a chunk of n parameters in memory: one buffer that starts at
// p. FP32 states have m and v; 8-bit states have q (m and v null).
struct StateView {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  Int8Moments q{};
  std::byte* buffer = nullptr;  // the staging buffer, if any

  // The state's bytes, from p on.
  std::byte* bytes() const { return reinterpret_cast<std::byte*>(p); }
};

// The moments of an 8-bit state from element `offset` (a block boundary) on.
inline Int8Moments MomentsAt(const Int8Moments& q, uint64_t offset) {
  const uint64_t b = offset / kInt8StateBlock;
  return Int8Moments{q.m + offset, q.m_scale + b, q.v + offset, q.v_scale + b};
}

// Gradients of [offset, offset + n) of a chunk (offsets from its begin), in
// host memory.
struct GradRange {
  uint64_t offset = 0;
  uint64_t n = 0;
  const void* grads = nullptr;
};

struct StateShape {
  uint64_t num_params = 0;
  StatePrecision precision = StatePrecision::kFp32;

  uint64_t bytes() const { return StateBytes(num_params, precision); }
  // The view of the bytes() at `state` (4-byte aligned), with `buffer`.
  StateView ViewOf(std::byte* state, std::byte* buffer = nullptr) const;
};

}  // namespace strata

#endif  // STRATA_SHARD_STATE_VIEW_H_
