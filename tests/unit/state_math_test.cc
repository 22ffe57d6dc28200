// A chunk's state of either precision (shard/state_math.h): an 8-bit
// state's step with its gradients in ranges that cut blocks gives the bits of
// one fused pass (rounding by place in the model); blocks whose parameters take different constants
// match an FP32 step over their decoded moments; partial writes keep what they do not cover;
// conversion between precisions round-trips 8-bit codes.
#include "shard/state_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "kernels/int8_adam.h"

namespace strata {
namespace {

// A state buffer of `shape` (4-byte aligned) with random p and moments of
// magnitudes over 40 binades, a block of zeros among them.
struct State {
  State(StateShape shape, uint32_t seed) : shape(shape), words((shape.bytes() + 3) / 4) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> binade(-40, 0);
    const uint64_t n = shape.num_params;
    std::vector<float> p(n), m(n), v(n);
    for (uint64_t i = 0; i < n; ++i) {
      p[i] = unit(rng);
      m[i] = std::ldexp(unit(rng), binade(rng) / 4);
      v[i] = std::ldexp(std::fabs(unit(rng)), binade(rng) / 2);
      if (i / kInt8StateBlock == 1) m[i] = v[i] = 0.0f;
    }
    const StateShape fp32{n, StatePrecision::kFp32};
    std::vector<std::byte> values(fp32.bytes());
    const StateView in = fp32.ViewOf(values.data());
    std::copy(p.begin(), p.end(), in.p);
    std::copy(m.begin(), m.end(), in.m);
    std::copy(v.begin(), v.end(), in.v);
    ConvertState(fp32, values.data(), shape, bytes());
  }
  std::byte* bytes() { return reinterpret_cast<std::byte*>(words.data()); }
  StateView view() { return shape.ViewOf(bytes()); }
  // p, m, v in FP32.
  std::vector<float> Fp32() {
    const uint64_t n = shape.num_params;
    std::vector<float> out(3 * n);
    ReadStateFp32(shape, view(), 0, n, out.data(), out.data() + n, out.data() + 2 * n);
    return out;
  }

  StateShape shape;
  std::vector<uint32_t> words;
};

AdamConstants Constants(float lr, float weight_decay, int64_t step) {
  AdamConfig config;
  config.lr = lr;
  config.weight_decay = weight_decay;
  return MakeAdamConstants(config, step, /*coef=*/1.0f);
}

std::vector<float> Gradients(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

constexpr uint32_t kSeed = 20261128;

TEST(StateMathTest, GradientRangesThatCutBlocksGiveTheBitsOfOneFusedPass) {
  std::printf("seed %u\n", kSeed);
  // Five blocks and a short one; ranges cut inside blocks and on a boundary.
  const uint64_t n = 5 * kInt8StateBlock + 77;
  const StateShape shape{n, StatePrecision::kInt8};
  const std::vector<float> g = Gradients(n, kSeed);
  const AdamConstants c = Constants(1e-3f, 0.01f, 3);
  const std::vector<ConstantsSpan> one_span = {{0, n, c}};
  // 512 parameters before the 2^32nd in the model: the fused pass of step 3
  // with the rounding of each window of 2^32 (int8_adam.h).
  const uint64_t flat_begin = (uint64_t{1} << 32) - 512;

  State fused(shape, kSeed);
  std::vector<float> fused_copy(n);
  const StateView f = fused.view();
  AdamUpdateInt8(c, DType::kFp32, g.data(), f.p, f.q,
                 Int8Rounding{Int8RoundingSeed(0, 3), static_cast<uint32_t>(flat_begin)},
                 DType::kFp32, fused_copy.data(), 512);
  AdamUpdateInt8(c, DType::kFp32, g.data() + 512, f.p + 512,
                 Int8Moments{f.q.m + 512, f.q.m_scale + 2, f.q.v + 512, f.q.v_scale + 2},
                 Int8Rounding{Int8RoundingSeed(1, 3), 0}, DType::kFp32, fused_copy.data() + 512,
                 n - 512);

  State cut(shape, kSeed);
  std::vector<float> cut_copy(n);
  std::vector<GradRange> ranges;
  for (const auto& [begin, end] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 100}, {100, 256}, {256, 700}, {700, 701}, {701, 1300}, {1300, n}}) {
    ranges.push_back({begin, end - begin, g.data() + begin});
  }
  ApplyAdamStep(shape, cut.view(), cut.view(), one_span, ranges, DType::kFp32,
                reinterpret_cast<std::byte*>(cut_copy.data()), flat_begin, /*step=*/3);
  EXPECT_EQ(cut.words, fused.words);
  EXPECT_EQ(cut_copy, fused_copy);
}

TEST(StateMathTest, ABlockOfTwoGroupsMatchesAnFp32StepOverItsDecodedMoments) {
  std::printf("seed %u\n", kSeed);
  const uint64_t n = 3 * kInt8StateBlock;
  const uint64_t cut_at = kInt8StateBlock + 100;  // inside block 1
  const StateShape shape{n, StatePrecision::kInt8};
  const std::vector<float> g = Gradients(n, kSeed + 1);
  const AdamConstants a = Constants(1e-3f, 0.0f, 5), b = Constants(3e-3f, 0.1f, 5);
  const std::vector<ConstantsSpan> spans = {{0, cut_at, a}, {cut_at, n - cut_at, b}};
  State state(shape, kSeed + 2);
  const std::vector<float> before = state.Fp32();  // p, m, v decoded
  std::vector<float> copy(n);
  const GradRange all{0, n, g.data()};
  ApplyAdamStep(shape, state.view(), state.view(), spans, {&all, 1}, DType::kFp32,
                reinterpret_cast<std::byte*>(copy.data()), /*flat_begin=*/0, /*step=*/5);
  const std::vector<float> after = state.Fp32();

  // The FP32 step over the decoded moments, element by element with each
  // one's constants: p exactly, m and v within the codes' relative error
  // (2^-4) of the block's largest new value.
  std::vector<float> p(before.begin(), before.begin() + n),
      m(before.begin() + n, before.begin() + 2 * n), v(before.begin() + 2 * n, before.end());
  std::vector<float> want_copy(n);
  for (const ConstantsSpan& s : spans) {
    AdamUpdate(s.constants, DType::kFp32, g.data() + s.offset, p.data() + s.offset,
               m.data() + s.offset, v.data() + s.offset, DType::kFp32, want_copy.data() + s.offset,
               s.n);
  }
  EXPECT_TRUE(std::equal(p.begin(), p.end(), after.begin()));
  EXPECT_EQ(copy, want_copy);
  for (uint64_t block = 0; block < n; block += kInt8StateBlock) {
    float m_largest = 0, v_largest = 0;
    for (uint64_t i = block; i < block + kInt8StateBlock; ++i) {
      m_largest = std::max(m_largest, std::fabs(m[i]));
      v_largest = std::max(v_largest, v[i]);
    }
    for (uint64_t i = block; i < block + kInt8StateBlock; ++i) {
      // m to nearest (half a code step), v stochastically (a step).
      EXPECT_LE(std::fabs(after[n + i] - m[i]), std::fabs(m[i]) / 15 + m_largest * 0x1p-17f) << i;
      EXPECT_LE(std::fabs(after[2 * n + i] - v[i]), v[i] / 7 + v_largest * 0x1p-32f) << i;
    }
  }
}

// As GpuChunkState runs an 8-bit step: the plan's runs through the fused
// kernel over the gathered gradients, each shared block alone on the side.
TEST(StateMathTest, APlanRunAsADeviceRunsItGivesTheStepsBits) {
  std::printf("seed %u\n", kSeed);
  const uint64_t n = 6 * kInt8StateBlock + 77;
  const StateShape shape{n, StatePrecision::kInt8};
  const std::vector<float> g = Gradients(n, kSeed + 5);
  // Groups cut blocks 1 (twice: a span of one element) and 4 and end on the
  // boundary of block 3; the window of 2^32 ends at element 1536, inside the
  // last span.
  const std::vector<ConstantsSpan> spans = {{0, 300, Constants(1e-3f, 0.0f, 7)},
                                            {300, 1, Constants(2e-3f, 0.1f, 7)},
                                            {301, 467, Constants(1e-3f, 0.0f, 7)},
                                            {768, 300, Constants(3e-3f, 0.05f, 7)},
                                            {1068, n - 1068, Constants(1e-3f, 0.0f, 7)}};
  const uint64_t flat_begin = (uint64_t{1} << 32) - 1536;
  const GradRange all{0, n, g.data()};

  State stepped(shape, kSeed + 6);
  std::vector<float> stepped_copy(n);
  ApplyAdamStep(shape, stepped.view(), stepped.view(), spans, {&all, 1}, DType::kFp32,
                reinterpret_cast<std::byte*>(stepped_copy.data()), flat_begin, /*step=*/7);

  State planned(shape, kSeed + 6);
  std::vector<float> planned_copy(n);
  const StateView view = planned.view();
  const Int8StepPlan plan = PlanInt8Step(n, spans, {&all, 1}, DType::kFp32, flat_begin, 7);
  EXPECT_EQ(plan.shared_blocks, (std::vector<uint64_t>{kInt8StateBlock, 4 * kInt8StateBlock}));
  uint64_t run_params = 0;
  for (const Int8Run& r : plan.runs) {
    EXPECT_EQ(r.first % kInt8StateBlock, 0u);
    EXPECT_EQ((flat_begin + r.first) >> 32, (flat_begin + r.first + r.count - 1) >> 32);
    AdamUpdateInt8(*r.constants, DType::kFp32, r.grads, view.p + r.first,
                   MomentsAt(view.q, r.first), r.rounding, DType::kFp32,
                   planned_copy.data() + r.first, r.count);
    run_params += r.count;
  }
  EXPECT_EQ(run_params, n - 2 * kInt8StateBlock);
  for (const uint64_t block : plan.shared_blocks) {
    const StateShape alone{kInt8StateBlock, StatePrecision::kInt8};
    std::vector<uint32_t> words((alone.bytes() + 3) / 4);
    auto* bytes = reinterpret_cast<std::byte*>(words.data());
    ReadStoredRange(shape, view, block, kInt8StateBlock, bytes);
    ApplyAdamStepToBlock(n, block, alone.ViewOf(bytes), spans,
                         reinterpret_cast<const std::byte*>(g.data()), DType::kFp32,
                         reinterpret_cast<std::byte*>(planned_copy.data()), flat_begin, 7);
    WriteStoredRange(shape, view, block, kInt8StateBlock, bytes);
  }
  EXPECT_EQ(planned.words, stepped.words);
  EXPECT_EQ(planned_copy, stepped_copy);
}

TEST(StateMathTest, APartialWriteKeepsTheRestOfItsBlocksAndOtherBlocksBitwise) {
  std::printf("seed %u\n", kSeed);
  const uint64_t n = 4 * kInt8StateBlock;
  const StateShape shape{n, StatePrecision::kInt8};
  State state(shape, kSeed + 3);
  const std::vector<float> before = state.Fp32();
  const std::vector<uint32_t> words_before = state.words;
  // [300, 600): the end of block 1, block 2 up to 600 (blocks 0 and 3 untouched).
  const uint64_t begin = 300, count = 300;
  std::vector<float> p(count, 0.5f), m(count, -1e-3f), v(count, 2e-6f);
  WriteStateFp32(shape, state.view(), begin, count, p.data(), m.data(), v.data());
  const std::vector<float> after = state.Fp32();
  const StateView view = state.view();
  for (uint64_t i = 0; i < n; ++i) {
    const bool written = i >= begin && i < begin + count;
    const uint64_t b = i / kInt8StateBlock;
    const bool same_block = i >= kInt8StateBlock && i < 3 * kInt8StateBlock;
    for (int a = 0; a < 3; ++a) {
      const float got = after[a * n + i], was = before[a * n + i];
      const float want = written ? (a == 0 ? 0.5f : a == 1 ? -1e-3f : 2e-6f) : was;
      if (a == 0 || !same_block) {
        EXPECT_EQ(got, want) << "array " << a << " element " << i;
      } else {
        // Coded again with the block's new scale: within half a code step.
        const float slack = a == 1 ? view.q.m_scale[b] * 0x1p-17f : view.q.v_scale[b] * 0x1p-33f;
        EXPECT_NEAR(got, want, std::fabs(want) / 15 + slack) << "array " << a << " element " << i;
      }
    }
  }
  // The scales and codes of blocks 0 and 3 are bit for bit as they were.
  const StateView was =
      shape.ViewOf(reinterpret_cast<std::byte*>(const_cast<uint32_t*>(words_before.data())));
  for (uint64_t b : {uint64_t{0}, uint64_t{3}}) {
    EXPECT_EQ(view.q.m_scale[b], was.q.m_scale[b]);
    EXPECT_EQ(view.q.v_scale[b], was.q.v_scale[b]);
    EXPECT_EQ(
        std::memcmp(view.q.m + b * kInt8StateBlock, was.q.m + b * kInt8StateBlock, kInt8StateBlock),
        0);
  }
}

TEST(StateMathTest, ConversionToFp32AndBackKeepsEightBitCodes) {
  std::printf("seed %u\n", kSeed);
  const uint64_t n = 3 * kInt8StateBlock + 5;
  const StateShape int8{n, StatePrecision::kInt8}, fp32{n, StatePrecision::kFp32};
  State state(int8, kSeed + 4);
  std::vector<std::byte> wide(fp32.bytes());
  ConvertState(int8, state.bytes(), fp32, wide.data());
  // The FP32 form holds the decoded values ReadStateFp32 gives.
  const std::vector<float> decoded = state.Fp32();
  EXPECT_EQ(std::memcmp(wide.data(), decoded.data(), fp32.bytes()), 0);
  std::vector<uint32_t> back(state.words.size());
  ConvertState(fp32, wide.data(), int8, reinterpret_cast<std::byte*>(back.data()));
  EXPECT_EQ(back, state.words);
  EXPECT_EQ(int8.bytes(), n * 6 + 8 * Int8StateBlocks(n));
  EXPECT_EQ(fp32.bytes(), n * 12);
}

// A range of whole blocks read in its stored form is a state of its own
// (its bits, its blocks' scales) and writes back bit for bit; a stored
// state is checked before it is taken: negative or non-finite scales and
// non-finite params are named.
TEST(StateMathTest, StoredRangesCarryTheBitsAndAreCheckedBeforeUse) {
  std::printf("seed %u\n", kSeed);
  const uint64_t n = 3 * kInt8StateBlock + 5;
  const StateShape int8{n, StatePrecision::kInt8};
  State state(int8, kSeed + 5);
  const uint64_t offset = kInt8StateBlock, count = n - offset;
  EXPECT_TRUE(IsStoredRange(int8, offset, count));
  EXPECT_TRUE(IsStoredRange(int8, 0, kInt8StateBlock));
  EXPECT_FALSE(IsStoredRange(int8, 1, kInt8StateBlock));
  EXPECT_FALSE(IsStoredRange(int8, 0, kInt8StateBlock + 1));
  EXPECT_TRUE(IsStoredRange({n, StatePrecision::kFp32}, 1, 7));
  const StateShape piece{count, StatePrecision::kInt8};
  State stored(piece, kSeed);
  ReadStoredRange(int8, state.view(), offset, count, stored.bytes());
  const std::vector<float> whole = state.Fp32(), part = stored.Fp32();
  for (uint64_t i = 0; i < count; ++i) {
    ASSERT_EQ(part[i], whole[offset + i]);
    ASSERT_EQ(part[count + i], whole[n + offset + i]);
    ASSERT_EQ(part[2 * count + i], whole[2 * n + offset + i]);
  }
  State other(int8, kSeed + 6);
  const std::vector<uint32_t> other_before = other.words;
  WriteStoredRange(int8, other.view(), offset, count, stored.bytes());
  const StateView a = state.view(), b = other.view();
  EXPECT_EQ(std::memcmp(a.p + offset, b.p + offset, count * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.q.m_scale + 1, b.q.m_scale + 1, 3 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.q.v + offset, b.q.v + offset, count), 0);
  const StateView was = int8.ViewOf(reinterpret_cast<std::byte*>(
      const_cast<uint32_t*>(other_before.data())));  // block 0 untouched
  EXPECT_EQ(b.q.m_scale[0], was.q.m_scale[0]);
  EXPECT_EQ(std::memcmp(b.q.m, was.q.m, kInt8StateBlock), 0);

  EXPECT_TRUE(CheckStoredState(piece, stored.bytes(), "stored_state").ok());
  stored.view().q.v_scale[2] = -1.0f;
  absl::Status bad = CheckStoredState(piece, stored.bytes(), "stored_state");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "stored_state: exp_avg_sq block scales[2] is negative or not finite");
  stored.view().p[7] = NAN;
  bad = CheckStoredState(piece, stored.bytes(), "stored_state");
  EXPECT_EQ(bad.message(), "stored_state: params[7] is not finite");
  const StateShape fp32{4, StatePrecision::kFp32};
  State wide(fp32, kSeed);
  wide.view().m[3] = -INFINITY;
  EXPECT_EQ(CheckStoredState(fp32, wide.bytes(), "s").message(), "s: exp_avg[3] is not finite");
}

}  // namespace
}  // namespace strata
