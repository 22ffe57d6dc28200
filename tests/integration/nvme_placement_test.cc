// Chunks whose state does not fit in host memory go to the NVMe tier and
// train to exactly the same weights (bitwise) as with everything in host
// memory; placement shows both tiers. NVMe chunks are applied on threads of
// their own, so a stalled disk does not hold up host-tier chunks. Where a GPU
// is found, chunks fill a GPU tier first, then host memory, then NVMe, and
// still train to the same bits, with FP32 and with 8-bit states.
#include <atomic>
#include <filesystem>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "core/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "storage/gpu_tier.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr int kSteps = 12;
constexpr uint64_t kChunkParams = 4096;

ClientOptions WorkerOptions(const std::string& coordinator,
                            StatePrecision precision = StatePrecision::kFp32) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = "nvme-job";
  o.job.tensors = {{"w1", {256, 400}}, {"b1", {400}}, {"w2", {400, 80}}};  // ~135 K params
  o.job.world_size = 2;
  o.job.chunk_num_params = kChunkParams;
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.job.state_precision = precision;
  o.loss_scale = LossScaleOptions{true, 1024.0f, 2.0f, 0.5f, 100, 1.0f};
  o.initial.params =
      testing::InitialParams(FlatLayout::Create(o.job.tensors, kChunkParams)->num_params());
  return o;
}

// The number of chunks of `job_id` in each tier, all of which must have
// applied `step`.
std::map<std::string, int> ChunksPerTier(const std::string& coordinator, const std::string& job_id,
                                         int64_t step) {
  auto placement = testing::Placement(coordinator, job_id);
  EXPECT_TRUE(placement.ok()) << placement.status();
  std::map<std::string, int> chunks_per_tier;
  if (!placement.ok()) return chunks_per_tier;
  for (const auto& row : placement->rows()) {
    ++chunks_per_tier[row.tier()];
    EXPECT_EQ(row.applied_step(), step);
  }
  return chunks_per_tier;
}

struct TierRun {
  MasterState master;
  std::map<std::string, int> chunks_per_tier;
};

TierRun RunWith(uint64_t host_budget_bytes, uint64_t nvme_budget_bytes,
                int64_t gpu_budget_bytes = ShardServerOptions::kNoGpuTier,
                StatePrecision precision = StatePrecision::kFp32) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 1;
  cluster_options.gpu_budget_bytes = gpu_budget_bytes;
  cluster_options.host_budget_bytes = host_budget_bytes;
  cluster_options.nvme_budget_bytes = nvme_budget_bytes;
  auto cluster = LocalCluster::Start(cluster_options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  ClientOptions options = WorkerOptions((*cluster)->coordinator_address(), precision);
  size_t n = options.initial.params.size();
  TierRun run;
  run.master = testing::RunWorkers(options, kSteps, 1, [n](int rank, int64_t step, int micro) {
                 return testing::Gradient(n, rank, step, micro);
               }).master;
  run.chunks_per_tier = ChunksPerTier((*cluster)->coordinator_address(), "nvme-job", kSteps);
  return run;
}

// `got` and `want` hold the same master state, bit for bit, and trained.
void ExpectTrainedBitwiseAlike(const MasterState& got, const MasterState& want) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.exp_avg, want.exp_avg);
  EXPECT_EQ(got.exp_avg_sq, want.exp_avg_sq);
  EXPECT_NE(got.params, WorkerOptions("").initial.params);
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
  EXPECT_GE(WorkerOptions("").initial.params.size() * 12, 2 * (uint64_t{768} << 10));
  ExpectTrainedBitwiseAlike(mixed.master, host_only.master);
}

TEST(NvmePlacementTest, GpuThenHostThenNvmeTrainsBitwiseAsInHostMemory) {
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  // 135 K params. FP32: 2.1 MB of state on a GPU tier (16 bytes per
  // parameter there, with the scratch of gradients) of 640 KiB; 8-bit:
  // 1.1 MB (8 bytes per parameter) on one of 320 KiB. A host tier of 1 MiB
  // also holds every chunk's copies (4 bytes per parameter) and the staging
  // buffers; the rest goes to NVMe.
  for (const auto& [precision, gpu_budget_bytes] :
       {std::pair{StatePrecision::kFp32, int64_t{640} << 10},
        std::pair{StatePrecision::kInt8, int64_t{320} << 10}}) {
    SCOPED_TRACE(precision == StatePrecision::kInt8 ? "int8" : "fp32");
    TierRun host_only = RunWith(uint64_t{64} << 20, 0, ShardServerOptions::kNoGpuTier, precision);
    TierRun tiered = RunWith(uint64_t{1} << 20, uint64_t{16} << 20, gpu_budget_bytes, precision);
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_GT(tiered.chunks_per_tier["gpu"], 0);
    EXPECT_GT(tiered.chunks_per_tier["host"], 0);
    EXPECT_GT(tiered.chunks_per_tier["nvme"], 0);
    ExpectTrainedBitwiseAlike(tiered.master, host_only.master);
  }
}

// A GPU tier asked for on a GPU this machine lacks, or with a negative
// budget, stops the start-up with the reason; the default (auto) then runs
// without one.
TEST(GpuTierStartUpTest, AMissingGpuOrABadBudgetIsRefusedAndAutoGoesWithout) {
  ShardServerOptions options;
  options.coordinator_address = "127.0.0.1:1";  // never reached
  const testing::ScratchDir scratch("gpu_tier_start_up_test");
  options.data_dir = scratch.path();
  options.pin_host_memory = false;
  options.register_timeout = absl::Milliseconds(100);
  options.gpu_device = GpuCount();  // one past the last
  options.gpu_budget_bytes = int64_t{64} << 20;
  auto missing = ShardServer::Start(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              ::testing::AnyOf(::testing::HasSubstr(absl::StrCat("no GPU ", GpuCount())),
                               ::testing::HasSubstr("no CUDA support")));  // built without CUDA
  options.gpu_device = 0;
  options.gpu_budget_bytes = -5;
  auto negative = ShardServer::Start(options);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument) << negative.status();
  // Auto on a missing GPU: no GPU tier, so the start-up goes on to the
  // (unreachable) coordinator.
  options.gpu_device = GpuCount();
  options.gpu_budget_bytes = ShardServerOptions::kAutoGpuBudget;
  auto without = ShardServer::Start(options);
  EXPECT_EQ(without.status().code(), absl::StatusCode::kUnavailable) << without.status();
}

TEST(NvmePlacementTest, HostTierStepsDoNotWaitForStalledNvmeChunks) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 1;
  cluster_options.host_budget_bytes = uint64_t{1} << 20;
  cluster_options.nvme_budget_bytes = uint64_t{16} << 20;
  auto cluster = LocalCluster::Start(cluster_options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coordinator = (*cluster)->coordinator_address();
  // First a job of one 4096-parameter chunk (64 KiB): in host memory. Then
  // JobOptions' 1.6 MB of state, which does not fit: partly on NVMe.
  ClientOptions host_options = WorkerOptions(coordinator);
  host_options.job_id = "host-job";
  host_options.job.world_size = 1;
  host_options.job.tensors = {{"w", {64, 64}}};
  host_options.initial.params = testing::InitialParams(64 * 64);
  host_options.step_timeout = absl::Seconds(20);
  auto host_client = Client::Connect(host_options);
  ASSERT_TRUE(host_client.ok()) << host_client.status();
  ClientOptions nvme_options = WorkerOptions(coordinator);
  nvme_options.job.world_size = 1;
  auto nvme_client = Client::Connect(nvme_options);
  ASSERT_TRUE(nvme_client.ok()) << nvme_client.status();
  ASSERT_TRUE(testing::TrainStep(**host_client).ok());
  ASSERT_TRUE(testing::TrainStep(**nvme_client).ok());
  EXPECT_EQ(ChunksPerTier(coordinator, "host-job", 1).count("nvme"), 0u);
  ASSERT_GT(ChunksPerTier(coordinator, "nvme-job", 1)["nvme"], 0);

  // A disk that stalls: every NVMe executor thread is held.
  ThreadPool* nvme_executor = (*cluster)->servers()[0]->nvme_executor();
  ASSERT_NE(nvme_executor, nullptr);
  absl::Notification release;
  absl::BlockingCounter stalled(nvme_executor->num_threads());
  for (int i = 0; i < nvme_executor->num_threads(); ++i) {
    nvme_executor->Schedule([&] {
      stalled.DecrementCount();
      release.WaitForNotification();
    });
  }
  stalled.Wait();
  std::atomic<bool> nvme_step_done{false};
  absl::Status nvme_step;
  std::thread nvme_training([&] {
    nvme_step = testing::TrainStep(**nvme_client);
    nvme_step_done = true;
  });
  absl::Cleanup unstall = [&] {
    if (!release.HasBeenNotified()) release.Notify();
    nvme_training.join();
  };
  for (int s = 0; s < 3; ++s) {
    absl::Status step = testing::TrainStep(**host_client);
    ASSERT_TRUE(step.ok()) << "host-tier step behind stalled NVMe chunks: " << step;
  }
  EXPECT_FALSE(nvme_step_done) << "the NVMe job's step did not wait for its chunks";
  release.Notify();
  std::move(unstall).Invoke();
  EXPECT_TRUE(nvme_step.ok()) << nvme_step;
  EXPECT_EQ((*nvme_client)->step(), 2);
  EXPECT_EQ((*host_client)->step(), 4);
}

}  // namespace
}  // namespace strata
