// Chunks whose state does not fit in host memory go to the NVMe tier and
// train to exactly the same weights (bitwise) as with everything in host
// memory; placement shows both tiers.
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "server/local_cluster.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "tests/testing/job_runner.h"

namespace strata {
namespace {

constexpr int kSteps = 12;
constexpr uint64_t kChunkParams = 4096;

ClientOptions JobOptions(const std::string& coordinator) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = "nvme-job";
  o.tensors = {{"w1", {256, 400}}, {"b1", {400}}, {"w2", {400, 80}}};  // ~135 K params
  o.world_size = 2;
  o.chunk_num_params = kChunkParams;
  o.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.loss_scale = LossScaleOptions{true, 1024.0f, 2.0f, 0.5f, 100, 1.0f};
  o.initial_params =
      testing::InitialParams(FlatLayout::Create(o.tensors, kChunkParams)->num_params());
  return o;
}

struct TierRun {
  MasterState master;
  std::map<std::string, int> chunks_per_tier;
};

TierRun RunWith(uint64_t host_budget_bytes, uint64_t nvme_budget_bytes) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 1;
  cluster_options.host_budget_bytes = host_budget_bytes;
  cluster_options.nvme_budget_bytes = nvme_budget_bytes;
  auto cluster = LocalCluster::Start(cluster_options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  ClientOptions options = JobOptions((*cluster)->coordinator_address());
  size_t n = options.initial_params.size();
  TierRun run;
  run.master = testing::RunWorkers(options, kSteps, 1, [n](int rank, int64_t step, int micro) {
                 return testing::Gradient(n, rank, step, micro);
               }).master;
  auto stub = v1::Coordinator::NewStub(MakeChannel((*cluster)->coordinator_address()));
  v1::GetPlacementRequest request;
  request.set_job_id("nvme-job");
  v1::GetPlacementResponse placement;
  grpc::ClientContext context;
  EXPECT_TRUE(stub->GetPlacement(&context, request, &placement).ok());
  for (const auto& row : placement.rows()) {
    ++run.chunks_per_tier[row.tier()];
    EXPECT_EQ(row.applied_step(), kSteps);
  }
  return run;
}

TEST(NvmePlacementTest, StateTwiceTheHostBudgetTrainsBitwiseAsInHostMemory) {
  TierRun host_only = RunWith(uint64_t{64} << 20, 0);
  // 135 K params: 1.6 MB of state against a 768 KiB host budget, which also
  // holds the two copies of every chunk (4 bytes per parameter) and the
  // staging buffers.
  TierRun mixed = RunWith(uint64_t{768} << 10, uint64_t{16} << 20);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(host_only.chunks_per_tier["host"], 33);
  EXPECT_GT(mixed.chunks_per_tier["nvme"], 0);
  EXPECT_GT(mixed.chunks_per_tier["host"], 0);  // the fastest tier is filled first
  EXPECT_GE(JobOptions("").initial_params.size() * 12, 2 * (uint64_t{768} << 10));
  EXPECT_EQ(mixed.master.step, host_only.master.step);
  EXPECT_EQ(mixed.master.params, host_only.master.params);
  EXPECT_EQ(mixed.master.exp_avg, host_only.master.exp_avg);
  EXPECT_EQ(mixed.master.exp_avg_sq, host_only.master.exp_avg_sq);
  EXPECT_NE(mixed.master.params, JobOptions("").initial_params);
}

}  // namespace
}  // namespace strata
