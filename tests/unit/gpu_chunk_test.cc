// A chunk whose state is in GPU memory against the same chunk in host
// memory: the same pushes give the same bits (state, pulled copies and
// checkpoint files), in every dtype, with FP32 and with 8-bit states (two
// parameter groups whose boundary cuts a block of the 8-bit moments). Skips
// itself where no GPU is present.
#include <unistd.h>

#include <deque>
#include <fstream>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "shard/chunk.h"
#include "shard/gpu_chunk_state.h"
#include "shard/saved_chunk.h"
#include "storage/gpu_tier.h"
#include "storage/host_tier.h"
#include "testing/scratch_dir.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

constexpr uint64_t kBegin = 64;
constexpr uint64_t kN = 3 * 4096 + 17;     // pushed in three uneven ranges
constexpr uint64_t kGroupBoundary = 1000;  // inside the block from 768

class GpuChunkTest : public ::testing::TestWithParam<std::tuple<DType, StatePrecision>> {
 protected:
  void SetUp() override {
    if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
    auto gpu = OpenGpuTier(0, 1 << 20);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
    auto staging = StagingPool::Create(&host_, GpuStagingBytes(kN, dtype()), 1);
    ASSERT_TRUE(staging.ok()) << staging.status();
    staging_ = *std::move(staging);
    auto state = CreateGpuChunkState(gpu_.get(), staging_, shape(), dtype());
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ((*state)->shape().precision, shape().precision);
    EXPECT_GE(gpu_->used_bytes(), (*state)->num_bytes());
    EXPECT_LT(gpu_->used_bytes(), (*state)->num_bytes() + 256);  // cudaMalloc's alignment
    on_gpu_ = MakeChunk(*std::move(state));
    on_host_ = MakeChunk(*HostChunkState::Create(&host_, shape()));
  }

  DType dtype() const { return std::get<0>(GetParam()); }
  StateShape shape() const { return {kN, std::get<1>(GetParam())}; }

  std::unique_ptr<Chunk> MakeChunk(std::unique_ptr<ChunkState> state) {
    ChunkGroups groups;
    groups.weight_decay = {0.0f, 0.01f};
    groups.spans = {{0, kGroupBoundary, 0}, {kGroupBoundary, kN - kGroupBoundary, 1}};
    return std::make_unique<Chunk>(
        "job", 3, FlatRange{kBegin, kBegin + kN}, dtype(),
        AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, std::move(state), &host_,
        *host_.Allocate(ChunkCopyBytes(kN, dtype())), nullptr, 0, std::move(groups));
  }

  // Pushes random gradients of `step` to both chunks and applies them.
  void Step(int64_t step) {
    std::vector<float> g(kN);
    for (float& x : g) x = normal_(rng_);
    grads_.emplace_back(kN * DTypeSize(dtype()), '\0');
    CastFromFloat(g.data(), dtype(), grads_.back().data(), kN);
    const absl::string_view bytes = grads_.back();
    const size_t esize = DTypeSize(dtype());
    const uint64_t cuts[] = {0, 5000, 5001, kN};
    for (Chunk* chunk : {on_gpu_.get(), on_host_.get()}) {
      for (int i = 0; i < 3; ++i) {
        const uint64_t n = cuts[i + 1] - cuts[i];
        auto staged = chunk->Stage(
            step, {1}, kBegin + cuts[i], n, bytes.substr(cuts[i] * esize, n * esize),
            StepScalars{0.5f, 3e-3f}, [step](absl::Status s) { EXPECT_TRUE(s.ok()) << step << s; });
        ASSERT_TRUE(staged.ok()) << staged.status();
        if (*staged) chunk->Apply();
      }
      ASSERT_EQ(chunk->applied_step(), step);
    }
  }

  std::string Pull(Chunk& chunk, int64_t step) {
    std::string pulled;
    chunk.Pull(step, kBegin, kN, [&](absl::Status s, int64_t, absl::string_view bytes) {
      EXPECT_TRUE(s.ok()) << s;
      pulled = std::string(bytes);
    });
    return pulled;
  }

  std::vector<float> State(Chunk& chunk) {
    std::vector<float> pmv(3 * kN);
    float* p = pmv.data();
    EXPECT_TRUE(chunk.ReadState(kBegin, kN, p, p + kN, p + 2 * kN).ok());
    return pmv;
  }

  HostTier host_{uint64_t{16} << 20};
  std::unique_ptr<Tier> gpu_;
  std::shared_ptr<StagingPool> staging_;
  std::unique_ptr<Chunk> on_gpu_, on_host_;
  std::mt19937 rng_{testing::TestSeed()};
  std::normal_distribution<float> normal_;
  std::deque<std::string> grads_;  // the chunks keep views of pushed bytes
};

TEST_P(GpuChunkTest, TrainsBitwiseLikeAHostChunk) {
  // A state written at step 10 (through Load() and Commit()).
  std::vector<float> p(kN), m(kN), v(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    p[i] = normal_(rng_);
    m[i] = 0.1f * normal_(rng_);
    v[i] = 0.01f * std::fabs(normal_(rng_));
  }
  for (Chunk* chunk : {on_gpu_.get(), on_host_.get()}) {
    ASSERT_TRUE(chunk->WriteState(kBegin, p.data(), m.data(), v.data(), kN, 10).ok());
  }
  EXPECT_EQ(State(*on_gpu_), State(*on_host_));
  EXPECT_EQ(Pull(*on_gpu_, 10), Pull(*on_host_, 10));
  StateArena arena(0);
  // Each is written and read back in turn.
  const testing::ScratchDir scratch("gpu_chunk_test");
  const std::string path = scratch.path() + "/checkpoint";
  for (Chunk* chunk : {on_gpu_.get(), on_host_.get()}) {
    ASSERT_TRUE(chunk->ArmCheckpoint(12, &arena, path).ok());
  }
  for (int64_t step = 11; step <= 15; ++step) {
    Step(step);
    if (HasFatalFailure()) return;
    EXPECT_EQ(Pull(*on_gpu_, step), Pull(*on_host_, step)) << "step " << step;
    EXPECT_EQ(State(*on_gpu_), State(*on_host_)) << "step " << step;
  }
  EXPECT_EQ(Pull(*on_gpu_, 14), Pull(*on_host_, 14));
  // The checkpoint of step 12, kept while steps 13-15 went on.
  std::string files[2];
  int i = 0;
  for (Chunk* chunk : {on_gpu_.get(), on_host_.get()}) {
    std::optional<LossScaleState> loss_scale;
    auto checksum = chunk->SaveCheckpoint(&loss_scale);
    ASSERT_TRUE(checksum.ok()) << checksum.status();
    std::ifstream in(path, std::ios::binary);
    files[i++] = std::string((std::istreambuf_iterator<char>(in)), {});
  }
  EXPECT_EQ(files[0].size(), shape().bytes());
  EXPECT_TRUE(files[0] == files[1]);
  // The host chunk's second buffer goes back at its next step.
  Step(16);
  EXPECT_EQ(State(*on_gpu_), State(*on_host_));
  EXPECT_EQ(arena.taken_bytes(), 0u);
}

TEST_P(GpuChunkTest, AStateBeyondTheBudgetIsRefusedAndTakesNothing) {
  const uint64_t used = gpu_->used_bytes();
  auto state = CreateGpuChunkState(gpu_.get(), staging_, {1 << 20, shape().precision}, dtype());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kResourceExhausted) << state.status();
  EXPECT_EQ(gpu_->used_bytes(), used);
}

INSTANTIATE_TEST_SUITE_P(
    DTypesAndStates, GpuChunkTest,
    ::testing::Combine(::testing::Values(DType::kFp16, DType::kBf16, DType::kFp32),
                       ::testing::Values(StatePrecision::kFp32, StatePrecision::kInt8)),
    [](const auto& info) {
      return std::string(DTypeName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == StatePrecision::kInt8 ? "_int8" : "_fp32");
    });

}  // namespace
}  // namespace strata
