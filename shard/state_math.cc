#include "shard/state_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/round_up.h"
#include "kernels/adam.h"
#include "kernels/int8_adam.h"

namespace strata {
namespace {

uint64_t BlockStart(uint64_t offset) { return offset / kInt8StateBlock * kInt8StateBlock; }

// The view of `state` from element `offset` (a block boundary of an 8-bit
// state) on.
StateView ViewFrom(const StateView& state, uint64_t offset) {
  StateView view;
  view.p = state.p + offset;
  if (state.m != nullptr) {
    view.m = state.m + offset;
    view.v = state.v + offset;
  } else {
    view.q = MomentsAt(state.q, offset);
  }
  return view;
}

// The first of `count` FP32 values at `values` (any alignment) that is not
// finite or, with `non_negative`, is below 0; -1 when none.
int64_t FirstBadValue(const std::byte* values, uint64_t count, bool non_negative) {
  for (uint64_t i = 0; i < count; ++i) {
    float x;
    std::memcpy(&x, values + i * sizeof(float), sizeof(float));
    if (!std::isfinite(x) || (non_negative && x < 0)) return static_cast<int64_t>(i);
  }
  return -1;
}

// A range of the chunk with one span's constants and one gradient range.
struct Segment {
  uint64_t begin = 0, end = 0;
  const AdamConstants* constants = nullptr;
  const std::byte* grads = nullptr;  // of element `begin`
};

// The chunk cut where a span or a gradient range ends, in order.
std::vector<Segment> Segments(absl::Span<const ConstantsSpan> spans,
                              absl::Span<const GradRange> grads, size_t esize) {
  std::vector<Segment> segments;
  for (const GradRange& g : grads) {
    for (const ConstantsSpan& span : spans) {
      const uint64_t begin = std::max(g.offset, span.offset);
      const uint64_t end = std::min(g.offset + g.n, span.offset + span.n);
      if (begin >= end) continue;
      segments.push_back({begin, end, &span.constants,
                          static_cast<const std::byte*>(g.grads) + (begin - g.offset) * esize});
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  return segments;
}

void ApplyFp32(const StateView& in, const StateView& out, const std::vector<Segment>& segments,
               DType dtype, std::byte* copy_out) {
  const size_t esize = DTypeSize(dtype);
  for (const Segment& s : segments) {
    const uint64_t o = s.begin;
    AdamUpdate(*s.constants, dtype, s.grads, AdamInputs{in.p + o, in.m + o, in.v + o},
               AdamOutputs{out.p + o, out.m + o, out.v + o}, dtype, copy_out + o * esize,
               s.end - o);
  }
}

// The rounding of elements from `flat_index` on within one window of 2^32
// (int8_adam.h), and how many of them lie in it.
constexpr uint64_t kWindow = uint64_t{1} << 32;
Int8Rounding RoundingAt(uint64_t flat_index, int64_t step) {
  return Int8Rounding{Int8RoundingSeed(flat_index / kWindow, step),
                      static_cast<uint32_t>(flat_index % kWindow)};
}
uint64_t LeftInWindow(uint64_t flat_index) { return kWindow - flat_index % kWindow; }

Int8StepPlan PlanSegments(uint64_t n, const std::vector<Segment>& segments, size_t esize,
                          uint64_t flat_begin, int64_t step) {
  Int8StepPlan plan;
  for (const Segment& s : segments) {
    const uint64_t last = s.end == n ? n : BlockStart(s.end);
    for (uint64_t first = RoundUp(s.begin, kInt8StateBlock); first < last;) {
      const uint64_t count = std::min(last - first, LeftInWindow(flat_begin + first));
      plan.runs.push_back({first, count, s.constants, s.grads + (first - s.begin) * esize,
                           RoundingAt(flat_begin + first, step)});
      first += count;
    }
    if (s.begin % kInt8StateBlock != 0) plan.shared_blocks.push_back(BlockStart(s.begin));
  }
  // Segments come in order: a block that several begin in appears in a row.
  plan.shared_blocks.erase(std::unique(plan.shared_blocks.begin(), plan.shared_blocks.end()),
                           plan.shared_blocks.end());
  return plan;
}

// Runs `plan`: its runs through the fused kernel; each shared block decoded,
// stepped in FP32 piece by piece and coded as the fused pass would have.
void ApplyInt8(uint64_t n, const StateView& state, const std::vector<Segment>& segments,
               DType dtype, std::byte* copy_out, uint64_t flat_begin, int64_t step) {
  const size_t esize = DTypeSize(dtype);
  const Int8StepPlan plan = PlanSegments(n, segments, esize, flat_begin, step);
  for (const Int8Run& r : plan.runs) {
    AdamUpdateInt8(*r.constants, dtype, r.grads, state.p + r.first, MomentsAt(state.q, r.first),
                   r.rounding, dtype, copy_out + r.first * esize, r.count);
  }
  alignas(64) float m[kInt8StateBlock];
  alignas(64) float v[kInt8StateBlock];
  for (const uint64_t block : plan.shared_blocks) {
    const uint64_t block_end = std::min(n, block + kInt8StateBlock);
    const Int8Moments q = MomentsAt(state.q, block);
    DequantizeMoments(q, m, v, block_end - block);
    for (const Segment& s : segments) {
      const uint64_t begin = std::max(s.begin, block), end = std::min(s.end, block_end);
      if (begin >= end) continue;
      AdamUpdate(*s.constants, dtype, s.grads + (begin - s.begin) * esize, state.p + begin,
                 m + (begin - block), v + (begin - block), dtype, copy_out + begin * esize,
                 end - begin);
    }
    QuantizeMomentsRounded(m, v, q, RoundingAt(flat_begin + block, step), block_end - block);
  }
}

}  // namespace

Int8StepPlan PlanInt8Step(uint64_t n, absl::Span<const ConstantsSpan> spans,
                          absl::Span<const GradRange> grads, DType dtype, uint64_t flat_begin,
                          int64_t step) {
  const size_t esize = DTypeSize(dtype);
  return PlanSegments(n, Segments(spans, grads, esize), esize, flat_begin, step);
}

void ApplyAdamStepToBlock(uint64_t n, uint64_t block, const StateView& block_state,
                          absl::Span<const ConstantsSpan> spans, const std::byte* grads,
                          DType dtype, std::byte* copy_out, uint64_t flat_begin, int64_t step) {
  const uint64_t len = std::min(kInt8StateBlock, n - block);
  std::vector<ConstantsSpan> block_spans;
  for (const ConstantsSpan& s : spans) {
    const uint64_t begin = std::max(s.offset, block), end = std::min(s.offset + s.n, block + len);
    if (begin < end) block_spans.push_back({begin - block, end - begin, s.constants});
  }
  const size_t esize = DTypeSize(dtype);
  const GradRange block_grads{0, len, grads + block * esize};
  // Alone, the block is one whose first element is `flat_begin + block`: the
  // same rounding, and shared by its spans there too.
  ApplyAdamStep({len, StatePrecision::kInt8}, block_state, block_state, block_spans,
                {&block_grads, 1}, dtype, copy_out + block * esize, flat_begin + block, step);
}

void ApplyAdamStep(const StateShape& shape, const StateView& in, const StateView& out,
                   absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                   DType dtype, std::byte* copy_out, uint64_t flat_begin, int64_t step) {
  const std::vector<Segment> segments = Segments(spans, grads, DTypeSize(dtype));
  if (shape.precision == StatePrecision::kFp32) {
    ApplyFp32(in, out, segments, dtype, copy_out);
    return;
  }
  // The 8-bit kernels work in place.
  if (in.p != out.p) std::memcpy(out.p, in.p, shape.bytes());
  ApplyInt8(shape.num_params, out, segments, dtype, copy_out, flat_begin, step);
}

void ReadStateFp32(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                   float* p, float* m, float* v) {
  std::memcpy(p, state.p + offset, n * sizeof(float));
  if (shape.precision == StatePrecision::kFp32) {
    std::memcpy(m, state.m + offset, n * sizeof(float));
    std::memcpy(v, state.v + offset, n * sizeof(float));
    return;
  }
  alignas(64) float block_m[kInt8StateBlock];
  alignas(64) float block_v[kInt8StateBlock];
  for (uint64_t block = BlockStart(offset); block < offset + n; block += kInt8StateBlock) {
    const uint64_t block_end = std::min(shape.num_params, block + kInt8StateBlock);
    DequantizeMoments(MomentsAt(state.q, block), block_m, block_v, block_end - block);
    const uint64_t begin = std::max(offset, block), end = std::min(offset + n, block_end);
    std::memcpy(m + (begin - offset), block_m + (begin - block), (end - begin) * sizeof(float));
    std::memcpy(v + (begin - offset), block_v + (begin - block), (end - begin) * sizeof(float));
  }
}

void WriteStateFp32(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                    const float* p, const float* m, const float* v) {
  std::memcpy(state.p + offset, p, n * sizeof(float));
  if (shape.precision == StatePrecision::kFp32) {
    std::memcpy(state.m + offset, m, n * sizeof(float));
    std::memcpy(state.v + offset, v, n * sizeof(float));
    return;
  }
  alignas(64) float block_m[kInt8StateBlock];
  alignas(64) float block_v[kInt8StateBlock];
  for (uint64_t block = BlockStart(offset); block < offset + n; block += kInt8StateBlock) {
    const uint64_t block_end = std::min(shape.num_params, block + kInt8StateBlock);
    const uint64_t begin = std::max(offset, block), end = std::min(offset + n, block_end);
    const Int8Moments q = MomentsAt(state.q, block);
    if (begin != block || end != block_end)
      DequantizeMoments(q, block_m, block_v, block_end - block);
    std::memcpy(block_m + (begin - block), m + (begin - offset), (end - begin) * sizeof(float));
    std::memcpy(block_v + (begin - block), v + (begin - offset), (end - begin) * sizeof(float));
    QuantizeMoments(block_m, block_v, q, block_end - block);
  }
}

bool IsStoredRange(const StateShape& shape, uint64_t offset, uint64_t n) {
  if (shape.precision == StatePrecision::kFp32) return true;
  return offset % kInt8StateBlock == 0 &&
         (n % kInt8StateBlock == 0 || offset + n == shape.num_params);
}

std::vector<absl::Span<std::byte>> StoredRangeSpans(const StateShape& shape, const StateView& state,
                                                    uint64_t offset, uint64_t n) {
  const StateView at = ViewFrom(state, offset);
  auto span = [](void* data, uint64_t bytes) {
    return absl::Span<std::byte>(static_cast<std::byte*>(data), bytes);
  };
  if (shape.precision == StatePrecision::kFp32) {
    return {span(at.p, n * sizeof(float)), span(at.m, n * sizeof(float)),
            span(at.v, n * sizeof(float))};
  }
  const uint64_t blocks = Int8StateBlocks(n);
  return {span(at.p, n * sizeof(float)), span(at.q.m_scale, blocks * sizeof(float)),
          span(at.q.v_scale, blocks * sizeof(float)), span(at.q.m, n), span(at.q.v, n)};
}

void ReadStoredRange(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                     std::byte* out) {
  for (const absl::Span<std::byte>& span : StoredRangeSpans(shape, state, offset, n)) {
    std::memcpy(out, span.data(), span.size());
    out += span.size();
  }
}

void WriteStoredRange(const StateShape& shape, const StateView& state, uint64_t offset, uint64_t n,
                      const std::byte* in) {
  for (const absl::Span<std::byte>& span : StoredRangeSpans(shape, state, offset, n)) {
    std::memcpy(span.data(), in, span.size());
    in += span.size();
  }
}

absl::Status CheckStoredState(const StateShape& shape, const std::byte* state,
                              absl::string_view field) {
  const uint64_t n = shape.num_params;
  struct Array {
    const char* name;
    uint64_t count;
    bool non_negative;
  };
  const bool int8 = shape.precision == StatePrecision::kInt8;
  const uint64_t blocks = Int8StateBlocks(n);
  const Array arrays[] = {
      {"params", n, false},
      {int8 ? "exp_avg block scales" : "exp_avg", int8 ? blocks : n, int8},
      {int8 ? "exp_avg_sq block scales" : "exp_avg_sq", int8 ? blocks : n, true}};
  const std::byte* values = state;
  for (const Array& array : arrays) {
    const int64_t bad = FirstBadValue(values, array.count, array.non_negative);
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", array.name, "[", bad, "] is ",
                                                     array.non_negative ? "negative or " : "",
                                                     "not finite"));
    }
    values += array.count * sizeof(float);
  }
  return absl::OkStatus();
}

void ConvertState(const StateShape& from_shape, const std::byte* from, const StateShape& to_shape,
                  std::byte* to) {
  if (from_shape.precision == to_shape.precision) {
    std::memcpy(to, from, from_shape.bytes());
    return;
  }
  const uint64_t n = from_shape.num_params;
  // The views do not write through `from`.
  const StateView in = from_shape.ViewOf(const_cast<std::byte*>(from));
  const StateView out = to_shape.ViewOf(to);
  std::memcpy(out.p, in.p, n * sizeof(float));
  if (to_shape.precision == StatePrecision::kInt8) {
    QuantizeMoments(in.m, in.v, out.q, n);
  } else {
    DequantizeMoments(in.q, out.m, out.v, n);
  }
}

}  // namespace strata
