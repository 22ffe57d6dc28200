// A shard server whose chunks are on NVMe is killed with SIGKILL between
// steps, and again in the middle of steps, and restarted on the same
// directories: it finds its chunks, the placement is the same, the worker
// (which does not restart, and sees no error: it pushes and pulls an
// interrupted step again) continues, and the final weights equal those of an
// uninterrupted run, bit for bit. A server stopped cleanly saves the chunks
// it holds in host (or GPU) memory and brings them back where they were.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "storage/gpu_tier.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr uint64_t kChunkParams = 65536;

ClientOptions WorkerOptions(const std::string& coordinator) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = "restart-job";
  o.worker_id = "w0";
  o.job.tensors = {{"w", {1024, 1024}}};  // 16 chunks of 768 KiB of state
  o.job.chunk_num_params = kChunkParams;
  o.job.adam = AdamConfig{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, true};
  o.loss_scale = LossScaleOptions{false, 1.0f, 2.0f, 0.5f, 1000, 1.0f};
  o.step_timeout = absl::Seconds(60);
  o.initial.params =
      testing::InitialParams(FlatLayout::Create(o.job.tensors, kChunkParams)->num_params());
  return o;
}

void Train(Client& client, int steps) {
  SCOPED_TRACE("training");
  for (int s = 0; s < steps; ++s) {
    absl::Status step = testing::TrainStep(client);
    ASSERT_TRUE(step.ok()) << step;
  }
}

std::string Placement(const std::string& coordinator) {
  auto response = testing::Placement(coordinator, "restart-job");
  EXPECT_TRUE(response.ok()) << response.status();
  if (!response.ok()) return "";
  std::string text;
  for (const auto& row : response->rows()) {
    absl::StrAppend(&text, row.chunk_id(), " ", row.server_address(), " ", row.tier(), " ",
                    row.applied_step(), "\n");
  }
  return text;
}

// The copy of `step` of every chunk of the job, pulled from its server; a
// failed pull gives its status instead.
std::vector<std::string> PullAll(const std::string& coordinator, int64_t step) {
  auto placement = testing::Placement(coordinator, "restart-job");
  EXPECT_TRUE(placement.ok()) << placement.status();
  std::vector<std::string> copies;
  if (!placement.ok()) return copies;
  for (const auto& row : placement->rows()) {
    auto shard = v1::ShardServer::NewStub(MakeChannel(row.server_address()));
    v1::PullRequest pull;
    pull.set_job_id("restart-job");
    pull.set_step(step);
    pull.set_flat_begin(row.flat_begin());
    pull.set_num_params(row.num_params());
    v1::PullResponse response;
    absl::Status s =
        CallUnary(shard.get(), &v1::ShardServer::Stub::Pull, pull, &response, absl::Seconds(30));
    copies.push_back(s.ok() ? response.params() : s.ToString());
  }
  return copies;
}

// The uninterrupted run: `steps` steps of JobOptions on an in-process cluster.
MasterState Uninterrupted(int steps) {
  auto cluster = LocalCluster::Start({1, uint64_t{256} << 20, 1});
  EXPECT_TRUE(cluster.ok());
  if (!cluster.ok()) return {};
  auto client = Client::Connect(WorkerOptions((*cluster)->coordinator_address()));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return {};
  Train(**client, steps);
  return *(*client)->ReadMasterState();
}

TEST(ServerRestartTest, SigkilledServerResumesFromItsNvmeChunks) {
  const MasterState want = Uninterrupted(7);
  const testing::ScratchDir scratch("server_restart_test");
  const std::string& dir = scratch.path();

  testing::Processes daemons;
  std::string bin = STRATA_BIN_DIR;
  std::string coordinator_address = testing::StartCoordinator(bin, dir, &daemons);
  ASSERT_FALSE(coordinator_address.empty());
  // 6 MiB of host memory holds the two copies of every chunk (4 MiB) and
  // the staging buffers (2 x 768 KiB: one NVMe executor thread and one
  // spare), none of the 12 MiB of state: every chunk
  // goes to NVMe.
  auto start_server = [&](const std::string& listen) {
    return testing::StartServer(bin, dir, "server", coordinator_address,
                                {"--listen=" + listen, "--host_budget_mib=6",
                                 "--nvme_dir=" + dir + "/nvme", "--nvme_budget_mib=32"},
                                &daemons);
  };
  testing::ServerProcess server = start_server("127.0.0.1:0");
  const std::string server_address = server.address;
  ASSERT_FALSE(server_address.empty());

  auto client = Client::Connect(WorkerOptions(coordinator_address));
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client, 3);
  std::string before = Placement(coordinator_address);
  EXPECT_NE(before.find("nvme 3"), std::string::npos) << before;
  ASSERT_EQ(before.find("host"), std::string::npos) << before;

  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
  daemons.Forget(server.pid);
  server = start_server(server_address);
  ASSERT_EQ(server.address, server_address);
  EXPECT_EQ(Placement(coordinator_address), before);  // same chunks, same steps

  // The same worker, not restarted, trains on while the server is killed
  // mid-step (once a chunk has applied step 5) and restarted.
  std::thread training([&] { Train(**client, 4); });
  for (int i = 0; i < 2000 && Placement(coordinator_address).find(" 5\n") == std::string::npos;
       ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
  daemons.Forget(server.pid);
  server = start_server(server_address);
  ASSERT_EQ(server.address, server_address);
  training.join();
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto state = (*client)->ReadMasterState();
  ASSERT_TRUE(state.ok()) << state.status();
  const MasterState& got = *state;
  EXPECT_EQ(got.step, 7);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.exp_avg, want.exp_avg);
  EXPECT_EQ(got.exp_avg_sq, want.exp_avg_sq);

  client->reset();
  for (pid_t pid : daemons.pids) kill(pid, SIGTERM);
  for (pid_t pid : daemons.pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // clean shutdown
  }
  daemons.pids.clear();
}

// In host memory, or (where a GPU is found) in a GPU tier.
class CleanRestartTest : public ::testing::TestWithParam<TierKind> {};

TEST_P(CleanRestartTest, CleanlyStoppedServerBringsBackItsMemoryChunks) {
  const bool on_gpu = GetParam() == TierKind::kGpu;
  if (on_gpu && GpuCount() == 0) GTEST_SKIP() << "no GPU";
  const MasterState want = Uninterrupted(6);
  const testing::ScratchDir scratch(
      absl::StrCat("server_clean_restart_test_", TierKindName(GetParam())));
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  std::string bin = STRATA_BIN_DIR;
  std::string coordinator_address = testing::StartCoordinator(bin, dir, &daemons);
  ASSERT_FALSE(coordinator_address.empty());
  auto start_server = [&](const std::string& listen) {
    return testing::StartServer(
        bin, dir, "server", coordinator_address,
        {"--listen=" + listen, on_gpu ? "--gpu_budget_mib=64" : "--gpu_budget_mib=0",
         "--host_budget_mib=256"},
        &daemons);
  };
  testing::ServerProcess server = start_server("127.0.0.1:0");
  const std::string server_address = server.address;
  ASSERT_FALSE(server_address.empty());
  auto client = Client::Connect(WorkerOptions(coordinator_address));
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client, 3);
  std::string before = Placement(coordinator_address);
  EXPECT_NE(before.find(absl::StrCat(TierKindName(GetParam()), " 3")), std::string::npos) << before;

  // SIGTERM: a clean stop saves the 16 chunks and the copies of step 2 (a
  // torn step 3 would be recomputed from them); the restart loads them (and
  // removes the files, so that a later crash cannot bring back step 3).
  const std::vector<std::string> step2 = PullAll(coordinator_address, 2);
  kill(server.pid, SIGTERM);
  int status = 0;
  waitpid(server.pid, &status, 0);
  daemons.Forget(server.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string saved = dir + "/server/saved-chunks";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(saved), {}), 32);
  server = start_server(server_address);
  ASSERT_EQ(server.address, server_address);
  EXPECT_EQ(Placement(coordinator_address), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(saved), {}), 0);
  EXPECT_EQ(PullAll(coordinator_address, 2), step2) << "the copies of step 2 came back";

  Train(**client, 3);  // the same worker goes on
  ASSERT_FALSE(::testing::Test::HasFailure());
  MasterState got = *(*client)->ReadMasterState();
  EXPECT_EQ(got.step, 6);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.exp_avg, want.exp_avg);
  EXPECT_EQ(got.exp_avg_sq, want.exp_avg_sq);

  // A crash (SIGKILL) loses host memory: the job is not brought back.
  client->reset();
  kill(server.pid, SIGKILL);
  waitpid(server.pid, nullptr, 0);
  daemons.Forget(server.pid);
  ASSERT_EQ(start_server(server_address).address, server_address);
  EXPECT_NE(Placement(coordinator_address).find("missing -1"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Tiers, CleanRestartTest,
                         ::testing::Values(TierKind::kHost, TierKind::kGpu),
                         [](const auto& info) { return std::string(TierKindName(info.param)); });

}  // namespace
}  // namespace strata
