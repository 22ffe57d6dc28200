// The streamed step (GradientsReady) over real gRPC and Gloo: workers
// (threads) that hand their last micro-batch's gradient over range by range,
// in an order of their own, train to the same master state, bit for bit, as
// workers that accumulate the whole gradient -- for 1, 2 and 3 workers, FP32
// and BF16, with accumulation and clipping -- and a gradient that overflows
// at one worker mid-stream skips the step everywhere, its pushes dropped.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "testing/cluster_test.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

using testing::Gradient;
using testing::SmallModel;

constexpr int kSteps = 6;
constexpr int kMicroBatches = 2;

ClientOptions WorkerOptions(const std::string& coordinator, const std::string& job, DType dtype,
                            uint32_t world_size) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = job;
  o.job.tensors = SmallModel();
  o.job.world_size = world_size;
  o.job.chunk_num_params = 256;
  o.bucket_num_params = 192;  // buckets, chunks, tensors and slices all cut differently
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.job.dtype = dtype;
  o.max_grad_norm = 0.5;  // clips: the norm's bits count
  o.initial.params = testing::InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
  return o;
}

// Each tensor cut in two, in an order drawn from `seed` and the rank.
std::vector<FlatRange> ShuffledRanges(const FlatLayout& layout, uint32_t seed, int rank) {
  std::vector<FlatRange> ranges;
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    FlatRange t = layout.tensor_range(i);
    const uint64_t middle = t.begin + t.size() / 3;
    ranges.push_back({t.begin, middle});
    ranges.push_back({middle, t.end});
  }
  std::mt19937 random(seed + rank);
  std::shuffle(ranges.begin(), ranges.end(), random);
  return ranges;
}

struct TrainingRun {
  std::vector<std::vector<StepResult>> steps;  // per rank, skipped steps included
  MasterState master;
};

// Steps with kMicroBatches micro-batches each; the last one streamed (or
// not). `poison(rank, step, attempt)`: whether that gradient holds an Inf.
TrainingRun Train(const ClientOptions& options, bool streamed, uint32_t seed,
                  const std::function<bool(int, int, int)>& poison) {
  TrainingRun run;
  run.steps.resize(options.job.world_size);
  testing::RunClients(options, [&](Client& c) {
    const uint64_t n = c.layout().num_params();
    for (int s = 1; s <= kSteps; ++s) {
      for (int attempt = 0;; ++attempt) {
        for (int micro = 0; micro + 1 < kMicroBatches; ++micro) {
          ASSERT_TRUE(c.AccumulateGradients(Gradient(n, c.rank(), s, micro)).ok());
        }
        // Zero in the padding between tensors, as a model's gradient is (the
        // streamed ranges cover the tensors only).
        std::vector<float> last(n, 0.0f);
        const std::vector<float> values = Gradient(n, c.rank(), s, kMicroBatches - 1);
        for (size_t t = 0; t < c.layout().tensors().size(); ++t) {
          FlatRange r = c.layout().tensor_range(t);
          std::copy(values.begin() + r.begin, values.begin() + r.end, last.begin() + r.begin);
        }
        if (poison(c.rank(), s, attempt)) last[n - 3] = INFINITY;
        if (streamed) {
          for (FlatRange r : ShuffledRanges(c.layout(), seed, c.rank())) {
            absl::Status ready =
                c.GradientsReady(r, absl::MakeConstSpan(last).subspan(r.begin, r.size()));
            ASSERT_TRUE(ready.ok()) << ready;
          }
        } else {
          ASSERT_TRUE(c.AccumulateGradients(last).ok());
        }
        auto step = c.Step();
        ASSERT_TRUE(step.ok()) << step.status();
        run.steps[c.rank()].push_back(*step);
        if (!step->skipped) break;
      }
    }
    if (c.rank() == 0) {
      auto master = c.ReadMasterState();
      ASSERT_TRUE(master.ok()) << master.status();
      run.master = *std::move(master);
    }
  });
  return run;
}

void ExpectSameTraining(const TrainingRun& streamed, const TrainingRun& plain,
                        const std::string& name) {
  ASSERT_EQ(streamed.steps.size(), plain.steps.size());
  for (size_t r = 0; r < plain.steps.size(); ++r) {
    ASSERT_EQ(streamed.steps[r].size(), plain.steps[r].size()) << name << " rank " << r;
    for (size_t i = 0; i < plain.steps[r].size(); ++i) {
      EXPECT_EQ(streamed.steps[r][i].skipped, plain.steps[r][i].skipped) << name << " " << i;
      EXPECT_EQ(streamed.steps[r][i].grad_norm, plain.steps[r][i].grad_norm) << name << " " << i;
      EXPECT_EQ(streamed.steps[r][i].clip_factor, plain.steps[r][i].clip_factor) << name;
    }
  }
  EXPECT_EQ(streamed.master.step, kSteps) << name;
  EXPECT_EQ(streamed.master.params, plain.master.params) << name;
  EXPECT_EQ(streamed.master.exp_avg, plain.master.exp_avg) << name;
  EXPECT_EQ(streamed.master.exp_avg_sq, plain.master.exp_avg_sq) << name;
}

using StreamedStepTest = testing::LocalClusterTest<DType>;

TEST_P(StreamedStepTest, GivesTheMasterStateOfTheUnstreamedStepBitForBit) {
  const DType dtype = GetParam();
  const uint32_t seed = static_cast<uint32_t>(absl::ToUnixMicros(absl::Now()));
  std::cout << "seed " << seed << "\n";
  auto never = [](int, int, int) { return false; };
  for (uint32_t workers : {1u, 2u, 3u}) {
    const std::string name = absl::StrCat(DTypeName(dtype), "-", workers, " seed ", seed);
    const std::string job = absl::StrCat(DTypeName(dtype), "-", workers);
    TrainingRun plain =
        Train(WorkerOptions(cluster_->coordinator_address(), "plain-" + job, dtype, workers),
              /*streamed=*/false, seed, never);
    TrainingRun streamed =
        Train(WorkerOptions(cluster_->coordinator_address(), "streamed-" + job, dtype, workers),
              /*streamed=*/true, seed, never);
    ASSERT_FALSE(HasFailure()) << name;
    ExpectSameTraining(streamed, plain, name);
    EXPECT_NE(streamed.master.params, WorkerOptions("", "", dtype, 1).initial.params);
  }
}

TEST_P(StreamedStepTest, AnOverflowMidStreamSkipsTheStepEverywhere) {
  const DType dtype = GetParam();
  const uint32_t seed = static_cast<uint32_t>(absl::ToUnixMicros(absl::Now()));
  std::cout << "seed " << seed << "\n";
  // Rank 1's last range of step 3 overflows at its first try: its other
  // ranges and rank 0's were pushed by then.
  auto poison = [](int rank, int step, int attempt) {
    return rank == 1 && step == 3 && attempt == 0;
  };
  const std::string coordinator = cluster_->coordinator_address();
  TrainingRun plain =
      Train(WorkerOptions(coordinator, "plain-overflow", dtype, 2), false, seed, poison);
  TrainingRun streamed =
      Train(WorkerOptions(coordinator, "streamed-overflow", dtype, 2), true, seed, poison);
  ASSERT_FALSE(HasFailure());
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(streamed.steps[r].size(), static_cast<size_t>(kSteps + 1));
    EXPECT_TRUE(streamed.steps[r][2].skipped) << "rank " << r;
    EXPECT_FALSE(streamed.steps[r][3].skipped) << "rank " << r;
  }
  ExpectSameTraining(streamed, plain, absl::StrCat("overflow seed ", seed));
}

INSTANTIATE_TEST_SUITE_P(DTypes, StreamedStepTest, ::testing::Values(DType::kBf16, DType::kFp32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(StreamedStepBadInputTest, RefusesBadRangesAndChangesNothing) {
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions options = WorkerOptions((*cluster)->coordinator_address(), "bad", DType::kFp32, 1);
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;
  const uint64_t n = c.layout().num_params();
  std::vector<float> g = Gradient(n, 0, 1, 0);
  absl::Span<const float> all = absl::MakeConstSpan(g);
  absl::Status s = c.GradientsReady({0, n + 1}, absl::MakeConstSpan(std::vector<float>(n + 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("flat space"), absl::string_view::npos) << s;
  s = c.GradientsReady({0, 10}, all.subspan(0, 9));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  ASSERT_TRUE(c.GradientsReady({0, 100}, all.subspan(0, 100)).ok());
  s = c.GradientsReady({50, 150}, all.subspan(50, 100));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("overlap"), absl::string_view::npos) << s;
  s = c.AccumulateGradients(g);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  ASSERT_TRUE(c.GradientsReady({100, n}, all.subspan(100)).ok());
  auto step = c.Step();
  ASSERT_TRUE(step.ok()) << step.status();
  // The refusals changed nothing: the step is that of the whole gradient.
  auto reference = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(reference.ok());
  options.coordinator_address = (*reference)->coordinator_address();
  auto plain = Client::Connect(options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE((*plain)->AccumulateGradients(g).ok());
  ASSERT_TRUE((*plain)->Step().ok());
  EXPECT_EQ(c.ReadMasterState()->params, (*plain)->ReadMasterState()->params);
}

}  // namespace
}  // namespace strata
