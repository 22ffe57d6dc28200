// Jobs whose shard servers store Adam's moments 8-bit (JobOptions::
// state_precision kInt8): NVMe-resident chunks train bitwise as in host
// memory; such a job fits a host budget its FP32-state twin does not;
// checkpoints save the 8-bit state, restore it bit for bit and continue
// bitwise, restore into an FP32 job (decoded) and an FP32 checkpoint into an
// 8-bit job (coded); a damaged 8-bit file is DATA_LOSS. (Copies and moves of
// 8-bit chunks: replication_test.cc.)
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "coordinator/checkpoint_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/int8_adam.h"
#include "strata/client.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kChunkParams = 4096;

// A job of ~135 K parameters with 8-bit states, 2 workers.
ClientOptions Int8Job(const std::string& coordinator, const std::string& job_id) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = job_id;
  o.job.tensors = {{"w1", {256, 400}}, {"b1", {400}}, {"w2", {400, 80}}};
  o.job.world_size = 2;
  o.job.chunk_num_params = kChunkParams;
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true};
  o.job.state_precision = StatePrecision::kInt8;
  o.loss_scale = LossScaleOptions{true, 1024.0f, 2.0f, 0.5f, 100, 1.0f};
  o.initial.params =
      testing::InitialParams(FlatLayout::Create(o.job.tensors, kChunkParams)->num_params());
  return o;
}

ClientOptions Fp32Gradients(ClientOptions o) {
  o.job.dtype = DType::kFp32;
  o.loss_scale = LossScaleOptions{};
  return o;
}

std::vector<float> GradientOf(const ClientOptions& o, int rank, int64_t step, int micro) {
  return testing::Gradient(o.initial.params.size(), rank, step, micro);
}

struct TierRun {
  MasterState master;
  std::map<std::string, int> chunks_per_tier;
};

TierRun RunWith(const ClientOptions& job, uint64_t host_budget_bytes, uint64_t nvme_budget_bytes,
                int steps) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 1;
  cluster_options.host_budget_bytes = host_budget_bytes;
  cluster_options.nvme_budget_bytes = nvme_budget_bytes;
  auto cluster = LocalCluster::Start(cluster_options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  ClientOptions o = job;
  o.coordinator_address = (*cluster)->coordinator_address();
  TierRun run;
  run.master = testing::RunWorkers(o, steps, 1, [&o](int rank, int64_t step, int micro) {
                 return GradientOf(o, rank, step, micro);
               }).master;
  auto placement = testing::Placement(o.coordinator_address, o.job_id);
  EXPECT_TRUE(placement.ok()) << placement.status();
  if (placement.ok()) {
    for (const auto& row : placement->rows()) ++run.chunks_per_tier[row.tier()];
  }
  return run;
}

TEST(Int8StateTest, OnNvmeTrainsBitwiseAsInHostMemoryAndApartFromFp32) {
  const ClientOptions job = Int8Job("", "int8-job");
  TierRun host_only = RunWith(job, uint64_t{64} << 20, 0, 12);
  // 135 K params: 0.8 MB of 8-bit state against a 700 KiB host budget that
  // also holds the two copies of every chunk (4 bytes per parameter) and the
  // staging buffers.
  TierRun mixed = RunWith(job, uint64_t{700} << 10, uint64_t{16} << 20, 12);
  ClientOptions fp32_job = job;
  fp32_job.job.state_precision = StatePrecision::kFp32;
  TierRun fp32 = RunWith(fp32_job, uint64_t{64} << 20, 0, 12);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(mixed.chunks_per_tier["nvme"], 0);
  EXPECT_GT(mixed.chunks_per_tier["host"], 0);
  testing::ExpectSameState(mixed.master, host_only.master);
  // The 8-bit moments took effect, and stayed near FP32's.
  EXPECT_NE(host_only.master.exp_avg, fp32.master.exp_avg);
  EXPECT_NE(host_only.master.params, fp32.master.params);
  double largest = 0, difference = 0;
  for (size_t i = 0; i < fp32.master.params.size(); ++i) {
    largest = std::max(largest, std::fabs(double{fp32.master.params[i]} - job.initial.params[i]));
    difference =
        std::max(difference, std::fabs(double{host_only.master.params[i]} - fp32.master.params[i]));
  }
  std::printf("largest FP32 change %g, largest 8-bit difference from it %g\n", largest, difference);
  EXPECT_LT(difference, 0.25 * largest);
}

TEST(Int8StateTest, FitsAHostBudgetItsFp32TwinDoesNot) {
  const ClientOptions job = Int8Job("", "int8-fits");
  const uint64_t n = job.initial.params.size();
  // 16 bytes per parameter with FP32 states (12 + two FP16 copies), about 10
  // with 8-bit ones: a budget of 13.
  const uint64_t budget = 13 * n;
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 1;
  cluster_options.host_budget_bytes = budget;
  auto cluster = LocalCluster::Start(cluster_options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions fp32 = job;
  fp32.coordinator_address = (*cluster)->coordinator_address();
  fp32.job_id = "fp32-twin";
  fp32.job.world_size = 1;
  fp32.job.state_precision = StatePrecision::kFp32;
  absl::Status refused = Client::Connect(fp32).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;

  ClientOptions int8 = job;
  int8.coordinator_address = fp32.coordinator_address;
  int8.job.world_size = 1;
  auto client = Client::Connect(int8);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(testing::TrainStep(**client).ok());
  auto placement = testing::Placement(int8.coordinator_address, int8.job_id);
  ASSERT_TRUE(placement.ok()) << placement.status();
  uint64_t bytes = 0;
  for (const auto& row : placement->rows()) {
    EXPECT_EQ(row.tier(), "host");
    bytes += row.num_bytes();
  }
  EXPECT_LE(bytes, budget);
  // The state: 6 bytes per parameter and 8 per block of 256, beside the
  // copies' 4 (and each extent's rounding to 64 bytes).
  EXPECT_LE(bytes - 4 * n, 6 * n + 8 * Int8StateBlocks(n) + 64 * 2 * placement->rows_size());
}

TEST(Int8StateTest, CheckpointsRestoreBitwiseAndAcrossPrecisions) {
  const testing::ScratchDir scratch("int8_checkpoints");
  const std::string& dir = scratch.path();
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coordinator = (*cluster)->coordinator_address();
  // FP32 gradients: one worker's two micro-batches then sum as two workers' do.
  ClientOptions o = Fp32Gradients(Int8Job(coordinator, "int8-ckpt"));
  o.job.checkpoint_every_steps = 4;
  o.job.checkpoint_dir = dir;
  auto gradient = [&o](int rank, int64_t step, int micro) {
    return GradientOf(o, rank, step, micro);
  };
  const MasterState uninterrupted = testing::RunWorkers(o, 8, 1, gradient).master;
  ASSERT_EQ(uninterrupted.step, 8);
  const std::string at_four = CheckpointPath(dir, "int8-ckpt", 4);
  for (int i = 0; i < 300 && !std::filesystem::exists(at_four + "/manifest.json"); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  // 6 bytes and 2 scales per 256 parameters.
  const uint64_t file_bytes = std::filesystem::file_size(at_four + "/chunk-00000000.bin");
  EXPECT_EQ(file_bytes, kChunkParams * 6 + 8 * (kChunkParams / 256));

  // Into an 8-bit job on one worker with chunks of 2048: steps 5 to 8 again.
  ClientOptions r = Fp32Gradients(Int8Job(coordinator, "int8-restored"));
  r.job.world_size = 1;
  r.job.chunk_num_params = 2048;
  r.initial.params.clear();
  r.initial.checkpoint = at_four;
  const MasterState restored = testing::RunWorkers(r, 4, 2, [&](int, int64_t step, int micro) {
                                 return gradient(micro, step + 4, 0);
                               }).master;
  testing::ExpectSameState(restored, uninterrupted);

  // Into an FP32 job: the decoded moments, as an 8-bit job reads them.
  ClientOptions again = r;
  again.job_id = "int8-at-four";
  auto int8_client = Client::Connect(again);
  ASSERT_TRUE(int8_client.ok()) << int8_client.status();
  auto int8_state = (*int8_client)->ReadMasterState();
  ASSERT_TRUE(int8_state.ok()) << int8_state.status();
  EXPECT_EQ(int8_state->step, 4);
  ClientOptions wide = again;
  wide.job_id = "fp32-from-int8";
  wide.job.state_precision = StatePrecision::kFp32;
  auto fp32_client = Client::Connect(wide);
  ASSERT_TRUE(fp32_client.ok()) << fp32_client.status();
  auto fp32_state = (*fp32_client)->ReadMasterState();
  ASSERT_TRUE(fp32_state.ok()) << fp32_state.status();
  testing::ExpectSameState(*fp32_state, *int8_state);

  // An FP32 checkpoint into an 8-bit job: the moments coded (blocks of 256
  // from each chunk's start, which chunks of 2048 keep).
  auto [code, output] = testing::RunCommand(
      absl::StrCat(STRATA_BIN_DIR, "/stratactl --coordinator=", coordinator,
                   " --json --job=fp32-from-int8 --dir=", dir, " checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  const std::string fp32_checkpoint = CheckpointPath(dir, "fp32-from-int8", 4);
  ClientOptions narrow = again;
  narrow.job_id = "int8-from-fp32";
  narrow.initial.checkpoint = fp32_checkpoint;
  auto narrow_client = Client::Connect(narrow);
  ASSERT_TRUE(narrow_client.ok()) << narrow_client.status();
  auto narrow_state = (*narrow_client)->ReadMasterState();
  ASSERT_TRUE(narrow_state.ok()) << narrow_state.status();
  const size_t n = fp32_state->params.size();
  std::vector<uint8_t> m_codes(n), v_codes(n);
  std::vector<float> m_scales(Int8StateBlocks(n)), v_scales(Int8StateBlocks(n));
  const Int8Moments coded{m_codes.data(), m_scales.data(), v_codes.data(), v_scales.data()};
  QuantizeMoments(fp32_state->exp_avg.data(), fp32_state->exp_avg_sq.data(), coded, n);
  std::vector<float> m(n), v(n);
  DequantizeMoments(coded, m.data(), v.data(), n);
  EXPECT_TRUE(narrow_state->params == fp32_state->params);
  EXPECT_TRUE(narrow_state->exp_avg == m);
  EXPECT_TRUE(narrow_state->exp_avg_sq == v);

  // A damaged 8-bit chunk file.
  const std::string damaged = dir + "/damaged";
  std::filesystem::copy(at_four, damaged, std::filesystem::copy_options::recursive);
  {
    std::fstream f(damaged + "/chunk-00000001.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kChunkParams * 4 + 3));  // among the scales
    f.put('\x7f');
  }
  ClientOptions broken = r;
  broken.job_id = "int8-damaged";
  broken.initial.checkpoint = damaged;
  broken.rendezvous_timeout = absl::Seconds(10);
  absl::Status loss = Client::Connect(broken).status();
  EXPECT_EQ(loss.code(), absl::StatusCode::kDataLoss) << loss;
  EXPECT_THAT(loss.message(), HasSubstr("chunk-00000001.bin: checksum mismatch"));
}

}  // namespace
}  // namespace strata
