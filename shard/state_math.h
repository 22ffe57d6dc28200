// The operations on a chunk's state that depend on its precision
// (state_view.h): the AdamW step, reads and writes of FP32 values, and
// conversion between precisions. Pure functions over caller-owned memory;
// thread-safe for distinct states.
#ifndef STRATA_SHARD_STATE_MATH_H_
#define STRATA_SHARD_STATE_MATH_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "shard/chunk_groups.h"
#include "shard/state_view.h"
#include "strata/types.h"

namespace strata {

// Applies one AdamW step to the state `in` of `shape`, writing `out` (the
// same buffer or another of the same shape): each element with the
// constants of its span (`spans` cover the chunk) and its gradient from
// `grads` (ranges covering the chunk, in `dtype`); p's copy in `dtype` goes
// to `copy_out`. An 8-bit state rounds v as step `step` of the parameters
// from `flat_begin` (the chunk's place in the model) on (int8_adam.h); a
// block whose elements take different constants or gradient ranges gets the
// bits one fused pass would give it.
void ApplyAdamStep(const StateShape& shape, const StateView& in, const StateView& out,
                   absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                   DType dtype, std::byte* copy_out, uint64_t flat_begin, int64_t step);

// How ApplyAdamStep updates an 8-bit state of `n` parameters, so that
// another device can give the same bits: runs of whole blocks, each one
// fused pass (AdamUpdateInt8) with one span's constants over one gradient
// range, cut where a window of 2^32 parameters ends; and the blocks that
// several spans or ranges share, each decoded, stepped in FP32 (AdamUpdate)
// piece by piece and coded with QuantizeMomentsRounded at the rounding of
// its first element.
struct Int8Run {
  uint64_t first = 0;  // a block boundary
  uint64_t count = 0;
  const AdamConstants* constants = nullptr;  // into the spans planned with
  const std::byte* grads = nullptr;          // of element `first`, into the ranges
  Int8Rounding rounding{};
};
struct Int8StepPlan {
  std::vector<Int8Run> runs;
  std::vector<uint64_t> shared_blocks;  // the first element of each, ascending
};
// Only arithmetic is done on the ranges' pointers: they may be a device's.
Int8StepPlan PlanInt8Step(uint64_t n, absl::Span<const ConstantsSpan> spans,
                          absl::Span<const GradRange> grads, DType dtype, uint64_t flat_begin,
                          int64_t step);
// Steps one shared block of an 8-bit state of `n` parameters, the one from
// element `block` on, as ApplyAdamStep does: `block_state` is that block's
// state alone (StateShape{min(kInt8StateBlock, n - block), kInt8}),
// `grads` the whole chunk's gradients in one range, and its copy goes to
// copy_out + block * DTypeSize(dtype). For a device that runs the plan's
// runs itself and brings these blocks to the host.
void ApplyAdamStepToBlock(uint64_t n, uint64_t block, const StateView& block_state,
                          absl::Span<const ConstantsSpan> spans, const std::byte* grads,
                          DType dtype, std::byte* copy_out, uint64_t flat_begin, int64_t step);

// p, m and v of [offset, offset + n) in FP32 (8-bit moments decoded).
void ReadStateFp32(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                   float* p, float* m, float* v);

// Sets [offset, offset + n) from FP32 p, m and v. An 8-bit state codes the
// moments to nearest, each block touched with its elements outside the range
// as they were (decoded and coded again with the block's new scale).
void WriteStateFp32(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                    const float* p, const float* m, const float* v);

// Whether [offset, offset + n) of a state of `shape` has a stored form of
// its own (the bytes of a state of StateShape{n, shape.precision}): any
// range of an FP32 state; whole blocks of an 8-bit one, the last of which
// may end the state.
bool IsStoredRange(const StateShape& shape, uint64_t offset, uint64_t n);
// Where the stored form of [offset, offset + n) of `state` (IsStoredRange)
// lies in it: spans whose bytes, one after another, are that stored form.
std::vector<absl::Span<std::byte>> StoredRangeSpans(const StateShape& shape, const StateView& state,
                                                    uint64_t offset, uint64_t n);
// Copies [offset, offset + n) of `state` (IsStoredRange) to `out`, in its
// stored form: the same bits.
void ReadStoredRange(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                     std::byte* out);
// Sets [offset, offset + n) of `state` (IsStoredRange) from `in`, its
// stored form.
void WriteStoredRange(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                      const std::byte* in);
// OK when `state` (shape.bytes(), any alignment) is a state a step may
// start from: p and FP32 moments finite, v >= 0, 8-bit scales finite and
// >= 0 (every code is a value); INVALID_ARGUMENT naming `field` and the
// first element that is not.
absl::Status CheckStoredState(const StateShape& shape, const std::byte* state,
                              absl::string_view field);

// `from` (a whole state of `from_shape`) as a state of `to_shape` (the same
// parameters) at `to`: a copy when the precisions match.
void ConvertState(const StateShape& from_shape, const std::byte* from, const StateShape& to_shape,
                  std::byte* to);

}  // namespace strata

#endif  // STRATA_SHARD_STATE_MATH_H_
