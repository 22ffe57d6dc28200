// On-demand parameters (ParamResidency::kOnDemand) over real gRPC and Gloo:
// workers (threads) that hold only their slice and gather each tensor just
// before "using" it -- prefetching the next one -- train to the same master
// state, bit for bit, as workers that hold the whole model; the gathered
// values are those the replicated workers hold; bad gathers are refused.
// Streamed on demand, the gradients are sharded too: a worker holds its
// slice and a few buckets, not the model's gradient.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "testing/cluster_test.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

using testing::Gradient;
using testing::InitialParams;
using testing::SmallModel;

constexpr int kSteps = 12;

ClientOptions WorkerOptions(const std::string& coordinator, const std::string& job, DType dtype,
                            ParamResidency params, uint32_t world_size) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = job;
  o.job.tensors = SmallModel();
  o.job.world_size = world_size;
  o.job.chunk_num_params = 256;  // tensors, slices and chunks all cut differently
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.job.dtype = dtype;
  o.params = params;
  o.initial.params = InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
  return o;
}

// The parameters a worker sees at each step (flat, as FP32), and the master
// state at the end.
struct TrainingRun {
  std::vector<std::vector<float>> seen;  // rank 0's, per step
  std::vector<uint64_t> resident_param_bytes;
  std::vector<uint64_t> peak_grad_bytes;
  MasterState master;
};

// Gradients streamed as backward gives them: ranges of this many
// parameters, from the end of the flat space to its start.
constexpr uint64_t kStreamedRangeParams = 150;
constexpr uint64_t kBucketParams = 64;

// The whole flat space, tensor by tensor: on demand, gathers with the next
// tensor's gather in flight while this one is "used" (copied out).
std::vector<float> SeeParams(Client& client) {
  const FlatLayout& layout = client.layout();
  std::vector<float> flat(layout.num_params(), 0.0f);
  std::vector<std::vector<float>> buffers(layout.tensors().size());
  std::vector<std::unique_ptr<PendingGather>> pending(layout.tensors().size());
  auto start = [&](size_t i) {
    buffers[i].resize(layout.tensor_range(i).size());
    pending[i] = client.StartGather(layout.tensor_range(i), absl::MakeSpan(buffers[i]));
  };
  start(0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (i + 1 < buffers.size()) start(i + 1);
    absl::Status s = pending[i]->Wait();
    EXPECT_TRUE(s.ok()) << s;
    std::copy(buffers[i].begin(), buffers[i].end(), flat.begin() + layout.tensor_range(i).begin);
    buffers[i] = {};  // released
  }
  return flat;
}

// A gradient that depends on the parameters the worker saw, so that a
// wrong gather changes the result.
std::vector<float> GradientAt(const std::vector<float>& params, int rank, int64_t step) {
  std::vector<float> g = Gradient(params.size(), rank, step, 0);
  for (size_t i = 0; i < g.size(); ++i) g[i] += 0.1f * params[i];
  return g;
}

// Trains kSteps steps, the gradients accumulated whole or streamed.
TrainingRun Train(const ClientOptions& options, bool stream = false) {
  TrainingRun run;
  run.resident_param_bytes.resize(options.job.world_size);
  run.peak_grad_bytes.resize(options.job.world_size);
  testing::RunClients(options, [&](Client& c) {
    for (int s = 1; s <= kSteps; ++s) {
      std::vector<float> params = SeeParams(c);
      if (c.rank() == 0) run.seen.push_back(params);
      const std::vector<float> grads = GradientAt(params, c.rank(), s);
      if (!stream) ASSERT_TRUE(c.AccumulateGradients(grads).ok());
      for (uint64_t end = grads.size(); stream && end > 0;) {
        const FlatRange r{end - std::min(end, kStreamedRangeParams), end};
        ASSERT_TRUE(
            c.GradientsReady(r, absl::MakeConstSpan(grads).subspan(r.begin, r.size())).ok());
        end = r.begin;
      }
      auto step = c.Step();
      ASSERT_TRUE(step.ok()) << step.status();
    }
    run.resident_param_bytes[c.rank()] = c.resident_param_bytes();
    run.peak_grad_bytes[c.rank()] = c.peak_grad_bytes();
    if (c.rank() == 0) {
      auto master = c.ReadMasterState();
      ASSERT_TRUE(master.ok()) << master.status();
      run.master = *std::move(master);
    }
  });
  return run;
}

using OnDemandTest = testing::LocalClusterTest<DType>;

TEST_P(OnDemandTest, TrainsBitwiseLikeReplicatedParameters) {
  const DType dtype = GetParam();
  for (uint32_t workers : {2u, 3u}) {
    const std::string name = absl::StrCat(DTypeName(dtype), "-", workers);
    TrainingRun replicated =
        Train(WorkerOptions(cluster_->coordinator_address(), "replicated-" + name, dtype,
                            ParamResidency::kReplicated, workers));
    TrainingRun on_demand =
        Train(WorkerOptions(cluster_->coordinator_address(), "on-demand-" + name, dtype,
                            ParamResidency::kOnDemand, workers));
    ASSERT_FALSE(HasFailure());
    ASSERT_EQ(on_demand.seen.size(), static_cast<size_t>(kSteps));
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_EQ(on_demand.seen[s], replicated.seen[s]) << name << " step " << s + 1;
    }
    EXPECT_EQ(on_demand.master.step, kSteps);
    EXPECT_EQ(on_demand.master.params, replicated.master.params) << name;
    EXPECT_EQ(on_demand.master.exp_avg, replicated.master.exp_avg) << name;
    EXPECT_EQ(on_demand.master.exp_avg_sq, replicated.master.exp_avg_sq) << name;
    EXPECT_NE(on_demand.master.params, WorkerOptions("", "", dtype, {}, 1).initial.params);
    // Each worker holds its slice, not the model.
    FlatLayout layout = *FlatLayout::Create(SmallModel(), 256);
    for (uint32_t r = 0; r < workers; ++r) {
      EXPECT_EQ(on_demand.resident_param_bytes[r],
                layout.WorkerSlice(r, workers).size() * DTypeSize(dtype))
          << name << " rank " << r;
      EXPECT_GE(replicated.resident_param_bytes[r], layout.num_params() * DTypeSize(dtype));
    }
  }
}

TEST_P(OnDemandTest, StreamedGradientsAreShardedToo) {
  const DType dtype = GetParam();
  const size_t esize = DTypeSize(dtype);
  for (uint32_t workers : {2u, 3u}) {
    const std::string name = absl::StrCat(DTypeName(dtype), "-", workers);
    ClientOptions options = WorkerOptions(cluster_->coordinator_address(), "replicated-sg-" + name,
                                          dtype, ParamResidency::kReplicated, workers);
    options.bucket_num_params = kBucketParams;
    TrainingRun replicated = Train(options);
    options.job_id = "on-demand-sg-" + name;
    options.params = ParamResidency::kOnDemand;
    TrainingRun streamed = Train(options, /*stream=*/true);
    options.job_id = "on-demand-whole-" + name;
    TrainingRun accumulated = Train(options);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(streamed.master.step, kSteps);
    EXPECT_EQ(streamed.master.params, replicated.master.params) << name;
    EXPECT_EQ(streamed.master.exp_avg, replicated.master.exp_avg) << name;
    EXPECT_EQ(streamed.master.exp_avg_sq, replicated.master.exp_avg_sq) << name;
    FlatLayout layout = *FlatLayout::Create(SmallModel(), 256);
    const uint64_t model_bytes = layout.PaddedNumParams(workers) * esize;
    // Client::peak_grad_bytes: the slice and at most 4 buckets.
    const uint64_t buckets_bytes = 4 * kBucketParams * esize;
    for (uint32_t r = 0; r < workers; ++r) {
      const uint64_t slice_bytes = layout.WorkerSlice(r, workers).size() * esize;
      std::cout << name << " rank " << r << ": peak gradient bytes " << streamed.peak_grad_bytes[r]
                << " streamed on demand (slice " << slice_bytes << ", buckets of "
                << kBucketParams * esize << "), " << replicated.peak_grad_bytes[r]
                << " replicated\n";
      EXPECT_LE(streamed.peak_grad_bytes[r], slice_bytes + buckets_bytes) << name << " rank " << r;
      EXPECT_LT(streamed.peak_grad_bytes[r], model_bytes) << name << " rank " << r;
      EXPECT_EQ(replicated.peak_grad_bytes[r], model_bytes) << name << " rank " << r;
      // Micro-batches accumulated whole need the whole gradient, for a while.
      EXPECT_EQ(accumulated.peak_grad_bytes[r], slice_bytes + model_bytes) << name << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, OnDemandTest,
                         ::testing::Values(DType::kFp16, DType::kBf16, DType::kFp32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(OnDemandBadInputTest, RefusesBadGathersAndCopyParams) {
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(WorkerOptions((*cluster)->coordinator_address(), "bad",
                                              DType::kFp16, ParamResidency::kOnDemand, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;
  const uint64_t n = c.layout().num_params();
  std::vector<float> out(n);
  absl::Status s = c.GatherParams({0, n + 1}, absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("flat space"), absl::string_view::npos) << s;
  s = c.GatherParams({0, n}, absl::MakeSpan(out).subspan(1));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = c.CopyParams(absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  // The refusals changed nothing: a good gather still works and the job steps.
  ASSERT_TRUE(c.GatherParams({0, n}, absl::MakeSpan(out)).ok());
  std::vector<float> want = WorkerOptions("", "", DType::kFp16, {}, 1).initial.params;
  for (uint64_t i = 0; i < n; i += 97)
    EXPECT_NEAR(out[i], want[i], std::max(1e-3 * std::abs(want[i]), 1e-7));
  ASSERT_TRUE(c.AccumulateGradients(Gradient(n, 0, 1, 0)).ok());
  EXPECT_TRUE(c.Step().ok());
}

}  // namespace
}  // namespace strata
