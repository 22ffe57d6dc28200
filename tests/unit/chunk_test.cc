// The step state machine of one chunk: staging, exactly-once apply, stored
// results for retries, ABORTED for old and future steps.
#include "shard/chunk.h"

#include <unistd.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "kernels/half.h"
#include "shard/saved_chunk.h"
#include "storage/host_tier.h"
#include "storage/nvme_tier.h"
#include "testing/faulty_tier.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBegin = 128;
constexpr uint64_t kN = 100;

class ChunkTest : public ::testing::Test {
 protected:
  ChunkTest() : tier_(1 << 20) {
    auto copy = tier_.Allocate(ChunkCopyBytes(kN, DType::kFp16));
    chunk_ =
        std::make_unique<Chunk>("job", 1, FlatRange{kBegin, kBegin + kN}, DType::kFp16,
                                AdamConfig{}, *HostChunkState::Create(&tier_, {kN}), &tier_, *copy);
  }

  // Gradient bytes that stay valid for the whole test (the chunk keeps views).
  absl::string_view Grads(uint64_t n, float value) {
    std::vector<uint16_t> g(n, FloatToHalf(value));
    buffers_.push_back(std::string(reinterpret_cast<const char*>(g.data()), n * 2));
    return buffers_.back();
  }

  // Stages a push; its outcome lands in pushed_[index of the call].
  absl::StatusOr<bool> Stage(int64_t step, uint64_t begin, uint64_t n, absl::string_view grads,
                             float coef, uint64_t generation = 1,
                             std::optional<LossScaleState> loss_scale_after = std::nullopt) {
    size_t index = pushed_.size();
    pushed_.push_back(absl::UnknownError("not answered"));
    return chunk_->Stage(step, {generation}, begin, n, grads,
                         StepScalars{coef, std::nullopt, loss_scale_after},
                         [this, index](absl::Status s) { pushed_[index] = s; });
  }

  // Stages a push of a streamed step, whose scalars follow in a Commit().
  absl::StatusOr<bool> StageStreamed(int64_t step, uint64_t begin, uint64_t n,
                                     absl::string_view grads, PushRound round = {1}) {
    size_t index = pushed_.size();
    pushed_.push_back(absl::UnknownError("not answered"));
    return chunk_->Stage(step, round, begin, n, grads, std::nullopt,
                         [this, index](absl::Status s) { pushed_[index] = s; });
  }

  // p after Adam steps from p = 1 with gradients `g` times `coef`, each step's.
  std::vector<float> ExpectedParams(const std::vector<std::pair<float, float>>& g_and_coef) {
    std::vector<float> p(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f);
    std::vector<uint16_t> copy(kN);
    int64_t step = 0;
    for (auto [g_value, coef] : g_and_coef) {
      std::vector<float> g(kN, g_value);
      AdamUpdate(MakeAdamConstants(AdamConfig{}, ++step, coef), DType::kFp32, g.data(), p.data(),
                 m.data(), v.data(), DType::kFp16, copy.data(), kN);
    }
    return p;
  }

  std::vector<float> Params() {
    std::vector<float> p(kN), m(kN), v(kN);
    EXPECT_TRUE(chunk_->ReadState(kBegin, kN, p.data(), m.data(), v.data()).ok());
    return p;
  }

  // Pulls [kBegin, kBegin + kN) at `step`; returns the status and the bytes.
  std::pair<absl::Status, std::string> PullNow(int64_t step) {
    std::pair<absl::Status, std::string> result{absl::InternalError("not answered"), ""};
    chunk_->Pull(step, kBegin, kN, [&](absl::Status s, int64_t, absl::string_view bytes) {
      result = {s, std::string(bytes)};
    });
    return result;
  }

  HostTier tier_;
  StateArena arena_{0};  // checkpoint buffers, allocated when taken
  std::unique_ptr<Chunk> chunk_;
  const testing::ScratchDir scratch_{"chunk_test"};
  const std::string path_ = scratch_.path() + "/checkpoint";
  std::deque<std::string> buffers_;
  std::deque<absl::Status> pushed_;
};

TEST_F(ChunkTest, AppliesThePushedLearningRate) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  absl::Status first = absl::UnknownError("not answered");
  auto staged = chunk_->Stage(1, {1}, kBegin, 50, Grads(50, 0.5f), StepScalars{1.0f, 0.25f},
                              [&](absl::Status s) { first = s; });
  ASSERT_TRUE(staged.ok());
  // A push of the same step with another learning rate (or the job's) is refused.
  for (std::optional<float> lr : {std::optional<float>(0.5f), std::optional<float>()}) {
    auto other = chunk_->Stage(1, {1}, kBegin + 50, 50, Grads(50, 0.5f), StepScalars{1.0f, lr},
                               [](absl::Status) { ADD_FAILURE() << "a refused push answered"; });
    EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument) << other.status();
  }
  auto last = chunk_->Stage(1, {1}, kBegin + 50, 50, Grads(50, 0.5f), StepScalars{1.0f, 0.25f},
                            [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  ASSERT_TRUE(last.ok() && *last);
  chunk_->Apply();
  EXPECT_TRUE(first.ok()) << first;

  // Independent expectation: one Adam step with lr 0.25 instead of the job's.
  AdamConfig adam;
  adam.lr = 0.25f;
  std::vector<float> p(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f), g(kN, 0.5f);
  std::vector<uint16_t> copy(kN);
  AdamUpdate(MakeAdamConstants(adam, 1, 1.0f), DType::kFp32, g.data(), p.data(), m.data(), v.data(),
             DType::kFp16, copy.data(), kN);
  std::vector<float> got_p(kN), got_m(kN), got_v(kN);
  EXPECT_EQ(*chunk_->ReadState(kBegin, kN, got_p.data(), got_m.data(), got_v.data()), 1);
  EXPECT_EQ(got_p, p);
  EXPECT_NEAR(got_p[0], 0.75f, 1e-6);
}

TEST_F(ChunkTest, AppliesOnceWhenTheWholeRangeIsPushed) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  auto first = Stage(1, kBegin, 40, Grads(40, 0.5f), 1.0f);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(*first);
  // A pull for step 1 waits for the apply.
  bool answered = false;
  std::string pulled;
  chunk_->Pull(1, kBegin, kN, [&](absl::Status s, int64_t step, absl::string_view bytes) {
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(step, 1);
    answered = true;
    pulled = std::string(bytes);
  });
  EXPECT_FALSE(answered);
  // Overlap and a different coef are refused and change nothing.
  EXPECT_EQ(Stage(1, kBegin + 30, 20, Grads(20, 0.5f), 1.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Stage(1, kBegin + 40, 60, Grads(60, 0.5f), 2.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A retry of the first range is accepted and is not a second copy.
  EXPECT_FALSE(*Stage(1, kBegin, 40, Grads(40, 0.5f), 1.0f));
  auto last = Stage(1, kBegin + 40, 60, Grads(60, 0.5f), 1.0f);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(*last);
  EXPECT_FALSE(answered);
  // The pushes stay open until the step is applied.
  // Calls: 0 first range, 1 overlap and 2 other coef (refused, never
  // answered), 3 retry of the first range, 4 the rest.
  EXPECT_EQ(pushed_[0].code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(pushed_[1].code(), absl::StatusCode::kUnknown);
  EXPECT_TRUE(pushed_[3].ok());  // a retry is answered at once
  EXPECT_EQ(pushed_[4].code(), absl::StatusCode::kUnknown);
  chunk_->Apply();
  EXPECT_TRUE(answered);
  EXPECT_EQ(chunk_->applied_step(), 1);
  EXPECT_TRUE(pushed_[0].ok());
  EXPECT_TRUE(pushed_[4].ok());

  // Independent expectation: one Adam step from p = 1 with g = 0.5.
  std::vector<float> p(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f), g(kN, 0.5f);
  std::vector<uint16_t> copy(kN);
  AdamUpdate(MakeAdamConstants(AdamConfig{}, 1, 1.0f), DType::kFp32, g.data(), p.data(), m.data(),
             v.data(), DType::kFp16, copy.data(), kN);
  std::vector<float> got_p(kN), got_m(kN), got_v(kN);
  EXPECT_EQ(*chunk_->ReadState(kBegin, kN, got_p.data(), got_m.data(), got_v.data()), 1);
  EXPECT_EQ(got_p, p);
  EXPECT_EQ(pulled, std::string(reinterpret_cast<const char*>(copy.data()), kN * 2));

  // Retried push and pull of step 1 return the stored result; nothing changes.
  auto retry = Stage(1, kBegin, kN, Grads(kN, 100.0f), 1.0f);
  ASSERT_TRUE(retry.ok());
  EXPECT_FALSE(*retry);
  auto [status, bytes] = PullNow(1);
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(bytes, pulled);
  // Old and future steps are ABORTED.
  EXPECT_EQ(Stage(0, kBegin, kN, Grads(kN, 1.0f), 1.0f).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(Stage(3, kBegin, kN, Grads(kN, 1.0f), 1.0f).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(PullNow(5).first.code(), absl::StatusCode::kAborted);
  // Parameters can no longer be overwritten.
  EXPECT_EQ(chunk_->WriteParams(kBegin, got_p.data(), kN).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> after(kN), unused_m(kN), unused_v(kN);
  ASSERT_TRUE(chunk_->ReadState(kBegin, kN, after.data(), unused_m.data(), unused_v.data()).ok());
  EXPECT_EQ(after, p);
}

TEST_F(ChunkTest, AStreamedStepAppliesOnceStagedAndCommittedInEitherOrder) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  // Step 1: pushes first, the commit between them.
  EXPECT_FALSE(*StageStreamed(1, kBegin, 40, Grads(40, 0.5f)));
  EXPECT_FALSE(*chunk_->Commit(1, {1}, StepScalars{0.5f}));
  EXPECT_EQ(chunk_->Commit(1, {1}, StepScalars{0.25f}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A push that carries other scalars than the commit's is refused too.
  EXPECT_EQ(Stage(1, kBegin + 40, 60, Grads(60, 0.5f), 2.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunk_->staged_params(), 40u);
  ASSERT_TRUE(*StageStreamed(1, kBegin + 40, 60, Grads(60, 0.5f)));
  chunk_->Apply();
  EXPECT_TRUE(pushed_[0].ok());
  EXPECT_EQ(Params(), ExpectedParams({{0.5f, 0.5f}}));
  // Step 2: the commit first (another worker's pushes are late).
  EXPECT_FALSE(*chunk_->Commit(2, {1}, StepScalars{1.0f}));
  EXPECT_EQ(chunk_->applied_step(), 1);
  ASSERT_TRUE(*StageStreamed(2, kBegin, kN, Grads(kN, 0.25f)));
  chunk_->Apply();
  EXPECT_EQ(Params(), ExpectedParams({{0.5f, 0.5f}, {0.25f, 1.0f}}));
  // A commit of an applied step is a retry; other steps are ABORTED.
  EXPECT_FALSE(*chunk_->Commit(2, {1}, StepScalars{1.0f}));
  EXPECT_EQ(chunk_->Commit(1, {1}, StepScalars{1.0f}).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->Commit(5, {1}, StepScalars{1.0f}).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->applied_step(), 2);
}

TEST_F(ChunkTest, ANewerAttemptReplacesTheStagedPushesOfAnOverflowedOne) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  // Attempt 0 was pushed whole, then overflowed at some worker: no commit.
  EXPECT_FALSE(*StageStreamed(1, kBegin, kN, Grads(kN, 100.0f), {1, 0}));
  EXPECT_EQ(chunk_->staged_params(), kN);
  // Attempt 1 replaces it, pushes and commit alike.
  EXPECT_FALSE(*StageStreamed(1, kBegin, 50, Grads(50, 0.5f), {1, 1}));
  EXPECT_EQ(pushed_[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->staged_params(), 50u);
  // Late pushes and commits of attempt 0 are refused and change nothing.
  EXPECT_EQ(StageStreamed(1, kBegin + 50, 50, Grads(50, 100.0f), {1, 0}).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->Commit(1, {1, 0}, StepScalars{1.0f}).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_FALSE(*chunk_->Commit(1, {1, 1}, StepScalars{1.0f}));
  // A commit of a newer generation replaces the attempt's pushes too.
  EXPECT_FALSE(*chunk_->Commit(1, {2, 0}, StepScalars{1.0f}));
  EXPECT_EQ(pushed_[1].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->staged_params(), 0u);
  ASSERT_TRUE(*StageStreamed(1, kBegin, kN, Grads(kN, 0.5f), {2, 0}));
  chunk_->Apply();
  EXPECT_TRUE(pushed_[3].ok());
  EXPECT_EQ(Params(), ExpectedParams({{0.5f, 1.0f}}));
}

TEST_F(ChunkTest, ANewerGenerationReplacesTheStagedPushesOfAnOlderOne) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  const std::string step0 = PullNow(0).second;
  // Generation 1 pushed part of step 1 with its cut of the range, then lost
  // a worker; generation 2 pushes the whole range with another cut.
  ASSERT_TRUE(Stage(1, kBegin, 30, Grads(30, 100.0f), 3.0f, /*generation=*/1).ok());
  EXPECT_EQ(chunk_->staged_params(), 30u);
  ASSERT_FALSE(*Stage(1, kBegin, 50, Grads(50, 0.5f), 1.0f, /*generation=*/2));
  EXPECT_EQ(pushed_[0].code(), absl::StatusCode::kAborted);  // replaced, not applied
  EXPECT_EQ(chunk_->staged_params(), 50u);
  // A late push of generation 1 is refused and changes nothing.
  EXPECT_EQ(Stage(1, kBegin + 50, 50, Grads(50, 100.0f), 3.0f, 1).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->applied_round(), std::nullopt);  // no step applied yet
  ASSERT_TRUE(*Stage(1, kBegin + 50, 50, Grads(50, 0.5f), 1.0f, 2));
  chunk_->Apply();
  EXPECT_TRUE(pushed_[1].ok());
  EXPECT_TRUE(pushed_[3].ok());
  // The chunk names the round that made its step (copies compare it).
  EXPECT_EQ(chunk_->applied_round(), (PushRound{2, 0}));

  std::vector<float> p(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f), g(kN, 0.5f);
  std::vector<uint16_t> copy(kN);
  AdamUpdate(MakeAdamConstants(AdamConfig{}, 1, 1.0f), DType::kFp32, g.data(), p.data(), m.data(),
             v.data(), DType::kFp16, copy.data(), kN);
  std::vector<float> got_p(kN), got_m(kN), got_v(kN);
  ASSERT_EQ(*chunk_->ReadState(kBegin, kN, got_p.data(), got_m.data(), got_v.data()), 1);
  EXPECT_EQ(got_p, p);
  EXPECT_EQ(got_m, m);
  // Once applied, any generation's push of step 1 is a retry.
  EXPECT_FALSE(*Stage(1, kBegin, kN, Grads(kN, 7.0f), 1.0f, 3));
  EXPECT_TRUE(pushed_.back().ok());
  EXPECT_EQ(chunk_->applied_round(), (PushRound{2, 0}));

  // The copy of the step before stays pullable until the step after is
  // applied, so that a new generation can recompute a step some chunks took.
  auto [status0, bytes0] = PullNow(0);
  ASSERT_TRUE(status0.ok()) << status0;
  EXPECT_EQ(bytes0, step0);
  EXPECT_EQ(PullNow(1).second, std::string(reinterpret_cast<const char*>(copy.data()), kN * 2));
  ASSERT_TRUE(*Stage(2, kBegin, kN, Grads(kN, 0.5f), 1.0f, 3));
  // While step 2 is applied, step 1 is still served, step 0 no longer.
  EXPECT_TRUE(PullNow(1).first.ok());
  EXPECT_EQ(PullNow(0).first.code(), absl::StatusCode::kAborted);
  chunk_->Apply();
  EXPECT_EQ(PullNow(1).second, std::string(reinterpret_cast<const char*>(copy.data()), kN * 2));
  EXPECT_EQ(PullNow(0).first.code(), absl::StatusCode::kAborted);
}

TEST_F(ChunkTest, WriteStateSetsTheStateAndStepBeforeTheFirstPush) {
  std::vector<float> p(kN, 0.25f), m(kN, 0.01f), v(kN, 0.04f);
  ASSERT_TRUE(chunk_->WriteState(kBegin, p.data(), m.data(), v.data(), 60, 7).ok());
  // The rest of the chunk at another step is refused; at the same step it is not.
  EXPECT_EQ(chunk_->WriteState(kBegin + 60, p.data(), m.data(), v.data(), 40, 8).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(chunk_->WriteState(kBegin + 60, p.data(), m.data(), v.data(), 40, 7).ok());
  EXPECT_EQ(chunk_->applied_step(), 7);
  EXPECT_EQ(chunk_->applied_round(), std::nullopt);  // written, not applied
  std::vector<uint16_t> half(kN, FloatToHalf(0.25f));
  EXPECT_EQ(PullNow(7).second, std::string(reinterpret_cast<const char*>(half.data()), kN * 2));

  ASSERT_TRUE(*Stage(8, kBegin, kN, Grads(kN, 0.5f), 1.0f));
  chunk_->Apply();
  std::vector<float> want_p = p, want_m = m, want_v = v, g(kN, 0.5f);
  std::vector<uint16_t> copy(kN);
  AdamUpdate(MakeAdamConstants(AdamConfig{}, 8, 1.0f), DType::kFp32, g.data(), want_p.data(),
             want_m.data(), want_v.data(), DType::kFp16, copy.data(), kN);
  std::vector<float> got_p(kN), got_m(kN), got_v(kN);
  ASSERT_EQ(*chunk_->ReadState(kBegin, kN, got_p.data(), got_m.data(), got_v.data()), 8);
  EXPECT_EQ(got_p, want_p);
  EXPECT_EQ(got_v, want_v);
  // Once a step was applied, the state can no longer be written.
  EXPECT_EQ(chunk_->WriteState(kBegin, p.data(), m.data(), v.data(), kN, 8).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A chunk made for a seed takes no push or commit until its state is
// written (a server's CommitStep passes it by: awaiting_seed()).
TEST_F(ChunkTest, AChunkAwaitingItsSeedRefusesStepsUntilItsStateIsWritten) {
  chunk_->AwaitSeed();
  EXPECT_TRUE(chunk_->awaiting_seed());
  auto pushed = Stage(1, kBegin, kN, Grads(kN, 0.5f), 1.0f);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(pushed.status().message(), HasSubstr("awaits its seed"));
  EXPECT_EQ(chunk_->Commit(1, {1}, StepScalars{1.0f}).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->staged_params(), 0u);

  std::vector<float> p(kN, 0.25f), m(kN, 0.01f), v(kN, 0.04f);
  ASSERT_TRUE(chunk_->WriteState(kBegin, p.data(), m.data(), v.data(), 60, 7).ok());
  EXPECT_FALSE(chunk_->awaiting_seed());
  ASSERT_TRUE(chunk_->WriteState(kBegin + 60, p.data(), m.data(), v.data(), 40, 7).ok());
  ASSERT_TRUE(*Stage(8, kBegin, kN, Grads(kN, 0.5f), 1.0f));
  chunk_->Apply();
  EXPECT_EQ(chunk_->applied_step(), 8);
}

TEST_F(ChunkTest, WriteStateWithThePreviousCopyServesTheStepBeforeOnceWhole) {
  std::vector<float> p(kN, 0.25f), m(kN, 0.01f), v(kN, 0.04f);
  std::vector<uint16_t> before(kN, FloatToHalf(0.125f));
  const std::string previous(reinterpret_cast<const char*>(before.data()), kN * 2);
  // A copy of the wrong size, or of step -1, is refused.
  EXPECT_EQ(chunk_->WriteState(kBegin, p.data(), m.data(), v.data(), 60, 7, previous).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunk_->WriteState(kBegin, p.data(), m.data(), v.data(), kN, 0, previous).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(chunk_
                  ->WriteState(kBegin, p.data(), m.data(), v.data(), 60, 7,
                               absl::string_view(previous).substr(0, 60 * 2))
                  .ok());
  // Part of the chunk has its copy of step 6: not pullable yet.
  EXPECT_EQ(PullNow(6).first.code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(chunk_
                  ->WriteState(kBegin + 60, p.data(), m.data(), v.data(), 40, 7,
                               absl::string_view(previous).substr(60 * 2))
                  .ok());
  auto [status, bytes] = PullNow(6);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(bytes, previous);
  std::vector<uint16_t> half(kN, FloatToHalf(0.25f));
  EXPECT_EQ(PullNow(7).second, std::string(reinterpret_cast<const char*>(half.data()), kN * 2));
}

TEST_F(ChunkTest, AFenceRefusesOlderGenerationsAndWaitsForTheApplyInProgress) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  // Generation 1 staged part of step 1: the fence ends it, and refuses the rest.
  ASSERT_TRUE(Stage(1, kBegin, 30, Grads(30, 1.0f), 1.0f, /*generation=*/1).ok());
  absl::StatusOr<int64_t> fenced = chunk_->Fence(2, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 0);
  EXPECT_EQ(pushed_[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->staged_params(), 0u);
  EXPECT_EQ(Stage(1, kBegin + 30, 70, Grads(70, 1.0f), 1.0f, 1).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(chunk_->Commit(1, {1}, StepScalars{}).status().code(), absl::StatusCode::kAborted);
  // Generation 2 steps; a fence while its step is being applied waits for it.
  ASSERT_TRUE(*Stage(1, kBegin, kN, Grads(kN, 0.5f), 1.0f, 2));
  std::thread apply([&] {
    absl::SleepFor(absl::Milliseconds(200));
    chunk_->Apply();
  });
  fenced = chunk_->Fence(3, absl::Now() + absl::Seconds(5));
  apply.join();
  ASSERT_TRUE(fenced.ok()) << fenced.status();
  EXPECT_EQ(*fenced, 1);
  EXPECT_TRUE(pushed_.back().ok());
  EXPECT_EQ(chunk_->applied_step(), 1);
  // An apply that never comes ends the wait at the deadline.
  ASSERT_TRUE(*Stage(2, kBegin, kN, Grads(kN, 0.5f), 1.0f, 3));
  EXPECT_EQ(chunk_->Fence(4, absl::Now() + absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  chunk_->Apply();
  EXPECT_EQ(chunk_->applied_step(), 2);
}

// A checkpoint armed for step 1 gets the state of step 1, and the loss
// scaler its pushes reported, even when steps 2 and 3 are applied before it
// is written (they went to a second buffer: training's state has the same
// bits as in-place updates, and step 4 moves it back); a chunk past the step
// refuses to arm; a save that waits can be cancelled or time out.
TEST_F(ChunkTest, ACheckpointKeepsTheStateOfItsStepWhileTrainingGoesOn) {
  std::vector<float> init(kN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(kBegin, init.data(), kN).ok());
  ASSERT_TRUE(chunk_->ArmCheckpoint(1, &arena_, path_).ok());
  EXPECT_EQ(chunk_->ArmCheckpoint(2, &arena_, path_).code(), absl::StatusCode::kFailedPrecondition);
  auto scaler_after = [](int64_t step) {
    return LossScaleState{1024.0f * step, static_cast<int32_t>(step)};
  };
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(*Stage(step, kBegin, kN, Grads(kN, 0.25f * step), 1.0f, 1, scaler_after(step)));
    chunk_->Apply();
    if (step == 1) {
      std::vector<float> pmv(3 * kN);
      float* p = pmv.data();
      ASSERT_TRUE(chunk_->ReadState(kBegin, kN, p, p + kN, p + 2 * kN).ok());
      ASSERT_TRUE(SaveChunkState(path_ + ".want", reinterpret_cast<std::byte*>(p), 12 * kN).ok());
    }
  }
  std::optional<LossScaleState> loss_scale;
  absl::StatusOr<uint64_t> checksum = chunk_->SaveCheckpoint(&loss_scale);
  ASSERT_TRUE(checksum.ok()) << checksum.status();
  ASSERT_TRUE(loss_scale.has_value());
  EXPECT_EQ(loss_scale->scale, scaler_after(1).scale);
  EXPECT_EQ(loss_scale->good_steps, scaler_after(1).good_steps);
  std::ifstream got(path_, std::ios::binary), want(path_ + ".want", std::ios::binary);
  std::string got_bytes((std::istreambuf_iterator<char>(got)), {});
  std::string want_bytes((std::istreambuf_iterator<char>(want)), {});
  EXPECT_EQ(got_bytes.size(), 12 * kN);
  EXPECT_TRUE(got_bytes == want_bytes);
  std::vector<float> state(3 * kN);
  EXPECT_TRUE(
      LoadChunkState(path_, *checksum, 12 * kN, reinterpret_cast<std::byte*>(state.data())).ok());

  // Training's state: what in-place updates give, in the second buffer
  // (step 3) and back in the first after the save (step 4).
  std::vector<float> want_p(kN, 1.0f), want_m(kN, 0.0f), want_v(kN, 0.0f);
  std::vector<uint16_t> want_copy(kN);
  auto expect_live_state = [&](int64_t step) {
    std::vector<uint16_t> g(kN, FloatToHalf(0.25f * step));
    AdamUpdate(MakeAdamConstants(AdamConfig{}, step, 1.0f), DType::kFp16, g.data(), want_p.data(),
               want_m.data(), want_v.data(), DType::kFp16, want_copy.data(), kN);
    if (step < 3) return;
    std::vector<float> got_p(kN), got_m(kN), got_v(kN);
    ASSERT_TRUE(chunk_->ReadState(kBegin, kN, got_p.data(), got_m.data(), got_v.data()).ok());
    EXPECT_EQ(got_p, want_p) << "step " << step;
    EXPECT_EQ(got_m, want_m) << "step " << step;
    EXPECT_EQ(got_v, want_v) << "step " << step;
    auto [pulled, bytes] = PullNow(step);
    ASSERT_TRUE(pulled.ok());
    EXPECT_EQ(bytes, std::string(reinterpret_cast<const char*>(want_copy.data()), 2 * kN));
  };
  for (int64_t step = 1; step <= 3; ++step) expect_live_state(step);
  ASSERT_TRUE(*Stage(4, kBegin, kN, Grads(kN, 0.25f * 4), 1.0f));
  chunk_->Apply();
  expect_live_state(4);
  EXPECT_EQ(arena_.taken_bytes(), 0u) << "the second buffer was not given back";

  // Disarmed by the save; past step 2 now.
  EXPECT_EQ(chunk_->ArmCheckpoint(2, &arena_, path_).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(chunk_->ArmCheckpoint(5, &arena_, path_).ok());
  EXPECT_EQ(chunk_->AwaitCheckpointStep(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(chunk_->ArmCheckpoint(5, &arena_, path_).ok());
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(20));
    chunk_->CancelCheckpoint();
  });
  EXPECT_EQ(chunk_->AwaitCheckpointStep(absl::InfiniteFuture()).code(),
            absl::StatusCode::kCancelled);
  cancel.join();
  EXPECT_EQ(chunk_->SaveCheckpoint(&loss_scale).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ChunkTest, FailWaitersEndsPullsAndStagedPushes) {
  absl::Status got;
  chunk_->Pull(1, kBegin, kN, [&](absl::Status s, int64_t, absl::string_view) { got = s; });
  ASSERT_TRUE(Stage(1, kBegin, 10, Grads(10, 1.0f), 1.0f).ok());
  chunk_->FailWaiters(absl::UnavailableError("shutting down"));
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pushed_[0].code(), absl::StatusCode::kUnavailable);
  // The step can be pushed again, whole.
  auto whole = Stage(1, kBegin, kN, Grads(kN, 1.0f), 1.0f);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(*whole);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

constexpr uint64_t kNvmeN = 3000;  // not a multiple of the 4 KiB block

// A chunk whose state is on NVMe, behind a FaultyTier.
class NvmeChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto nvme = NvmeTier::Open(NvmeTierOptions{scratch_.path(), 1 << 20, 8});
    ASSERT_TRUE(nvme.ok()) << nvme.status();
    nvme_ = *std::move(nvme);
    faulty_ = std::make_unique<testing::FaultyTier>(nvme_.get());
    auto staging = StagingPool::Create(&host_, NvmeChunkState::StagingBytes({kNvmeN}), /*count=*/2);
    ASSERT_TRUE(staging.ok());
    slots_ = std::make_unique<NvmeSlots>(faulty_.get(), /*spares=*/2);
    auto state = NvmeChunkState::Create(slots_.get(), *std::move(staging), {kNvmeN});
    ASSERT_TRUE(state.ok()) << state.status();
    chunk_ = std::make_unique<Chunk>("job", 2, FlatRange{0, kNvmeN}, DType::kFp16, AdamConfig{},
                                     *std::move(state), &host_,
                                     *host_.Allocate(ChunkCopyBytes(kNvmeN, DType::kFp16)));
    grads_ = std::string(kNvmeN * 2, '\0');
    std::vector<uint16_t> g(kNvmeN, FloatToHalf(0.25f));
    std::memcpy(grads_.data(), g.data(), kNvmeN * 2);
  }
  void TearDown() override {
    chunk_.reset();
    slots_.reset();
    faulty_.reset();
    nvme_.reset();
  }

  absl::Status PushAndApply(int64_t step) {
    absl::Status pushed = absl::UnknownError("not answered");
    auto complete = chunk_->Stage(step, {1}, 0, kNvmeN, grads_, StepScalars{1.0f},
                                  [&](absl::Status s) { pushed = s; });
    if (!complete.ok()) return complete.status();
    if (*complete) chunk_->Apply();
    return pushed;
  }

  std::vector<float> Params() {
    std::vector<float> p(kNvmeN), m(kNvmeN), v(kNvmeN);
    EXPECT_TRUE(chunk_->ReadState(0, kNvmeN, p.data(), m.data(), v.data()).ok());
    return p;
  }

  const testing::ScratchDir scratch_{"nvme_chunk_test"};
  HostTier host_{1 << 20};
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<testing::FaultyTier> faulty_;
  std::unique_ptr<NvmeSlots> slots_;
  std::unique_ptr<Chunk> chunk_;
  std::string grads_;
};

TEST_F(NvmeChunkTest, AFailedWriteLeavesTheStepUnappliedAndARetrySucceeds) {
  std::vector<float> init(kNvmeN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(0, init.data(), kNvmeN).ok());
  ASSERT_TRUE(PushAndApply(1).ok());
  std::vector<float> after_one = Params();
  EXPECT_NE(after_one, init);

  absl::Status pulled = absl::UnknownError("not answered");
  chunk_->Pull(2, 0, kNvmeN, [&](absl::Status s, int64_t, absl::string_view) { pulled = s; });
  faulty_->FailNextWrites(1);
  absl::Status failed = PushAndApply(2);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_EQ(chunk_->applied_step(), 1);
  EXPECT_EQ(Params(), after_one);                        // the previous state, intact
  EXPECT_EQ(pulled.code(), absl::StatusCode::kUnknown);  // still waiting for step 2

  ASSERT_TRUE(PushAndApply(2).ok());  // the retry
  EXPECT_EQ(chunk_->applied_step(), 2);
  EXPECT_TRUE(pulled.ok());
  EXPECT_NE(Params(), after_one);
}

TEST_F(NvmeChunkTest, AFailedReadIsReportedAndChangesNothing) {
  ASSERT_TRUE(PushAndApply(1).ok());
  std::vector<float> before = Params();
  faulty_->FailNextReads(1);
  EXPECT_EQ(PushAndApply(2).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(chunk_->applied_step(), 1);
  EXPECT_EQ(Params(), before);
}

// The state's slot and the spare of its size (one state: one spare) are
// all it takes, through commits and a failed one.
TEST_F(NvmeChunkTest, AStateAndItsSpareKeepTheirBytesThroughCommits) {
  const uint64_t slot_bytes = NvmeChunkState::StagingBytes({kNvmeN});
  EXPECT_EQ(nvme_->used_bytes(), 2 * slot_bytes);
  std::vector<float> init(kNvmeN, 1.0f);
  ASSERT_TRUE(chunk_->WriteParams(0, init.data(), kNvmeN).ok());
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(PushAndApply(step).ok());
  EXPECT_EQ(nvme_->used_bytes(), 2 * slot_bytes);
  faulty_->FailNextWrites(1);
  EXPECT_EQ(PushAndApply(4).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(nvme_->used_bytes(), 2 * slot_bytes);
  ASSERT_TRUE(PushAndApply(4).ok());
  EXPECT_EQ(nvme_->used_bytes(), 2 * slot_bytes);
}

TEST_F(NvmeChunkTest, ARecordOfTwoSlotsRestoresItsCurrentOne) {
  chunk_.reset();
  auto staging = StagingPool::Create(&host_, NvmeChunkState::StagingBytes({kNvmeN}), 1);
  ASSERT_TRUE(staging.ok());
  std::shared_ptr<StagingPool> pool = *std::move(staging);
  auto state = NvmeChunkState::Create(slots_.get(), pool, {kNvmeN});
  ASSERT_TRUE(state.ok()) << state.status();
  auto view = (*state)->Load();
  ASSERT_TRUE(view.ok());
  for (uint64_t i = 0; i < kNvmeN; ++i) view->p[i] = 0.5f + i;
  ASSERT_TRUE((*state)->Commit(*view).ok());
  (*state)->Release(*view);
  (*state)->Retire();
  internal::ChunkRecord record;
  record.mutable_chunk()->set_num_params(kNvmeN);
  ASSERT_TRUE((*state)->Describe(&record).ok());
  ASSERT_EQ(record.slot_offsets_size(), 1);
  const uint64_t offset = record.slot_offsets(0);
  state->reset();  // the slot is free again; its bytes stay in the file
  ASSERT_EQ(nvme_->used_bytes(), 0u);

  // As versions with two fixed slots per state wrote it: the second current.
  record.clear_slot_offsets();
  record.add_slot_offsets(offset + (uint64_t{512} << 10));
  record.add_slot_offsets(offset);
  record.set_current_slot(1);
  auto restored =
      NvmeChunkState::Restore(nvme_.get(), slots_.get(), pool, record, StatePrecision::kFp32);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(nvme_->used_bytes(), NvmeChunkState::StagingBytes({kNvmeN}));  // the current one
  auto loaded = (*restored)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->p[kNvmeN - 1], 0.5f + (kNvmeN - 1));
  (*restored)->Release(*loaded);
  restored->reset();

  record.set_current_slot(2);
  EXPECT_EQ(NvmeChunkState::Restore(nvme_.get(), slots_.get(), pool, record, StatePrecision::kFp32)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(NvmeChunkTest, CorruptionOnDiskLosesTheChunkNamingChunkAndFile) {
  ASSERT_TRUE(PushAndApply(1).ok());
  // Flip a bit in every block of the tier's file.
  int fd = open(nvme_->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (off_t at = 0; at < (1 << 20); at += 4096) {
    char byte;
    ASSERT_EQ(pread(fd, &byte, 1, at), 1);
    byte ^= 0x10;
    ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  }
  close(fd);
  // The chunk is lost: its push is refused as UNAVAILABLE (the workers send
  // it again until the coordinator replaces the copy), naming the chunk and
  // the file; so are later pushes and pulls of the next step.
  absl::Status s = PushAndApply(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("chunk 2 of job job lost its state"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(nvme_->path()), absl::string_view::npos) << s;
  EXPECT_EQ(chunk_->lost().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(chunk_->applied_step(), 1);
  EXPECT_EQ(PushAndApply(2).code(), absl::StatusCode::kUnavailable);
  absl::Status pulled = absl::UnknownError("not answered");
  chunk_->Pull(2, 0, kNvmeN, [&](absl::Status st, int64_t, absl::string_view) { pulled = st; });
  EXPECT_EQ(pulled.code(), absl::StatusCode::kUnavailable) << pulled;
}

TEST_F(ChunkTest, WaitingPullsAreBoundedAndCancellable) {
  std::vector<absl::Status> got(Chunk::kMaxWaitingPulls + 1, absl::UnknownError("not answered"));
  std::vector<uint64_t> tickets;
  for (size_t i = 0; i <= Chunk::kMaxWaitingPulls; ++i) {
    tickets.push_back(chunk_->Pull(
        1, kBegin, kN, [&got, i](absl::Status s, int64_t, absl::string_view) { got[i] = s; }));
  }
  // The one past the bound is answered at once, and waits nowhere.
  EXPECT_EQ(tickets.back(), 0u);
  EXPECT_EQ(got.back().code(), absl::StatusCode::kResourceExhausted) << got.back();
  EXPECT_EQ(chunk_->waiting_pulls(), Chunk::kMaxWaitingPulls);
  // A cancelled pull is answered CANCELLED and frees its place; a ticket
  // already answered or never given changes nothing.
  chunk_->CancelPull(tickets[7], absl::CancelledError("gave up"));
  EXPECT_EQ(got[7].code(), absl::StatusCode::kCancelled);
  chunk_->CancelPull(tickets[7], absl::InternalError("twice"));
  chunk_->CancelPull(~uint64_t{0}, absl::InternalError("never given"));
  EXPECT_EQ(chunk_->waiting_pulls(), Chunk::kMaxWaitingPulls - 1);
  // The others are answered by the step.
  ASSERT_TRUE(Stage(1, kBegin, kN, Grads(kN, 1.0f), 1.0f).ok());
  chunk_->Apply();
  EXPECT_EQ(chunk_->waiting_pulls(), 0u);
  EXPECT_TRUE(got[0].ok()) << got[0];
  EXPECT_TRUE(got[Chunk::kMaxWaitingPulls - 1].ok());
  EXPECT_EQ(got[7].code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace strata
