// End-to-end over real gRPC and Gloo on loopback: 2 workers (threads) and
// shard servers in this process train a job; the FP32 master state must equal
// a single-process reference that applies the same reduced gradients with the
// reference AdamW, bit for bit (the order of operations is the same), and must
// not depend on the number of servers.
#include <cmath>

#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "kernels/elementwise.h"
#include "kernels/grad_stats.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

using testing::Gradient;
using testing::InitialParams;
using testing::RunResult;
using testing::RunWorkers;
using testing::SmallModel;

constexpr int kSteps = 24;
constexpr int kMicroBatches = 2;
constexpr int kOverflowStep = 5;  // rank 1 produces an Inf at this step

ClientOptions WorkerOptions(const std::string& coordinator) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = "cluster-test";
  o.job.tensors = SmallModel();
  o.job.world_size = 2;
  o.job.chunk_num_params = 256;
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.job.dtype = DType::kFp16;
  o.loss_scale = LossScaleOptions{true, 1024.0f, 2.0f, 0.5f, 10, 1.0f};
  o.max_grad_norm = 0.5;
  o.initial.params = InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
  return o;
}

std::vector<float> TestGradient(size_t n, int rank, int64_t step, int micro) {
  std::vector<float> g = Gradient(n, rank, step, micro);
  if (rank == 1 && step == kOverflowStep) g[3] = 1e30f;
  return g;
}

RunResult RunOn(int num_servers) {
  auto cluster = LocalCluster::Start({num_servers, uint64_t{64} << 20, 1});
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions options = WorkerOptions((*cluster)->coordinator_address());
  size_t n = options.initial.params.size();
  return RunWorkers(options, kSteps, kMicroBatches, [n](int rank, int64_t step, int micro) {
    return TestGradient(n, rank, step, micro);
  });
}

// The whole job in one process, with the same reductions and the scalar
// reference kernel over the flat space.
MasterState Reference(const ClientOptions& o) {
  FlatLayout layout = *FlatLayout::Create(o.job.tensors, o.job.chunk_num_params);
  size_t n = layout.num_params();
  MasterState state;
  state.params = o.initial.params;
  state.exp_avg.assign(n, 0.0f);
  state.exp_avg_sq.assign(n, 0.0f);
  LossScaler scaler(o.loss_scale);
  std::vector<uint16_t> copy(n);
  int64_t applied = 0;
  for (int s = 1; s <= kSteps; ++s) {
    std::vector<uint16_t> sum(n, 0);
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<uint16_t> acc(n, 0);
      for (int micro = 0; micro < kMicroBatches; ++micro) {
        AccumulateScaled(DType::kFp16, TestGradient(n, rank, s, micro).data(), scaler.scale(),
                         acc.data(), n);
      }
      AddInPlace(DType::kFp16, acc.data(), sum.data(), n);
    }
    double sum_squares = 0;
    bool finite = true;
    for (int rank = 0; rank < 2; ++rank) {
      FlatRange slice = layout.WorkerSlice(rank, 2);
      GradStats st = ComputeGradStats(DType::kFp16, sum.data() + slice.begin, slice.size());
      sum_squares += st.sum_squares;
      finite = finite && st.all_finite;
    }
    double divisor = static_cast<double>(scaler.scale()) * 2 * kMicroBatches;
    scaler.Update(!finite);
    if (!finite) continue;
    double norm = std::sqrt(sum_squares) / divisor;
    double clip = norm > o.max_grad_norm ? o.max_grad_norm / (norm + 1e-6) : 1.0;
    ++applied;
    AdamUpdate(MakeAdamConstants(o.job.adam, applied, static_cast<float>(clip / divisor)),
               DType::kFp16, sum.data(), state.params.data(), state.exp_avg.data(),
               state.exp_avg_sq.data(), DType::kFp16, copy.data(), n);
  }
  state.step = applied;
  return state;
}

TEST(ClusterTest, TwoWorkersTwoServersMatchSingleProcessReferenceBitwise) {
  RunResult run = RunOn(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  ClientOptions o = WorkerOptions("unused");
  MasterState want = Reference(o);
  // The overflow step was skipped by every rank and lowered the scale.
  for (const auto& rank_steps : run.steps) {
    ASSERT_EQ(rank_steps.size(), static_cast<size_t>(kSteps));
    EXPECT_TRUE(rank_steps[kOverflowStep - 1].skipped);
    EXPECT_EQ(rank_steps[kOverflowStep].loss_scale, rank_steps[kOverflowStep - 1].loss_scale / 2);
    EXPECT_EQ(rank_steps.back().step, kSteps - 1);
  }
  EXPECT_EQ(run.master.step, want.step);
  EXPECT_EQ(run.master.params, want.params);
  EXPECT_EQ(run.master.exp_avg, want.exp_avg);
  EXPECT_EQ(run.master.exp_avg_sq, want.exp_avg_sq);
  // And the weights moved: the test would pass vacuously otherwise.
  EXPECT_NE(run.master.params, o.initial.params);
}

TEST(ClusterTest, NumberOfServersNeverChangesTheMath) {
  RunResult one = RunOn(1);
  RunResult three = RunOn(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(one.master.params, three.master.params);
  EXPECT_EQ(one.master.exp_avg, three.master.exp_avg);
  EXPECT_EQ(one.master.exp_avg_sq, three.master.exp_avg_sq);
  EXPECT_EQ(one.master.step, three.master.step);
}

}  // namespace
}  // namespace strata
