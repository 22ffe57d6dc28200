// A rolling restart: while two workers train, each of three shard servers
// in turn is stopped cleanly (SIGTERM) at a random point of a step and
// started again on its directories and address. No worker fails, every
// worker completes each step once, in order, and the weights equal those of
// an uninterrupted run of the same job, bit for bit.
#include <signal.h>

#include <atomic>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "strata/client.h"
#include "testing/job_runner.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

constexpr int kServers = 3;
constexpr int64_t kSteps = 24;
constexpr int64_t kStepsBetweenRestarts = 5;

ClientOptions Job(const std::string& coordinator, const std::string& job_id) {
  ClientOptions o = testing::SmallFp32Job(coordinator, job_id);
  o.job.samples_per_step = 8;
  o.initial.params = testing::InitialParams(
      FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params());
  return o;
}

constexpr auto Compute = testing::ParamDependentGradient;

// Trains `options` to kSteps with two workers; returns the master state and
// sets `steps` to the steps each worker completed, in order. `on_step` is
// called after each completed step of rank 0.
MasterState Train(const ClientOptions& options, std::vector<std::vector<int64_t>>* steps,
                  const std::function<void(int64_t)>& on_step) {
  MasterState master;
  steps->assign(2, {});
  testing::RunClients(options, [&](Client& client) {
    const int rank = client.rank();
    while (client.step() < kSteps) {
      absl::StatusOr<StepResult> result = client.Step(Compute);
      ASSERT_TRUE(result.ok()) << "rank " << rank << ": " << result.status();
      (*steps)[rank].push_back(result->step);
      if (rank == 0) on_step(result->step);
    }
    if (rank == 0) {
      absl::StatusOr<MasterState> state = client.ReadMasterState();
      ASSERT_TRUE(state.ok()) << state.status();
      master = *std::move(state);
    }
  });
  return master;
}

TEST(RollingRestartTest, ServersRestartedInTurnLoseNoStep) {
  std::mt19937 rng(testing::TestSeed());
  const testing::ScratchDir scratch("rolling_restart");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  const std::string coordinator = testing::StartCoordinator(STRATA_BIN_DIR, dir, &daemons);
  ASSERT_FALSE(coordinator.empty());
  auto start_server = [&](int i, const std::string& listen) {
    return testing::StartServer(STRATA_BIN_DIR, dir, absl::StrCat("server-", i), coordinator,
                                {"--host_budget_mib=64", "--listen=" + listen}, &daemons);
  };
  std::vector<testing::ServerProcess> servers;
  for (int i = 0; i < kServers; ++i) {
    servers.push_back(start_server(i, "127.0.0.1:0"));
    ASSERT_FALSE(servers.back().address.empty()) << "server-" << i;
  }

  std::vector<std::vector<int64_t>> steady_steps;
  const MasterState want = Train(Job(coordinator, "steady"), &steady_steps, [](int64_t) {});
  ASSERT_FALSE(::testing::Test::HasFailure());

  // Server i is stopped once rank 0 has completed step 1 + 5i, after a
  // random delay of up to 20 ms (within a step: they take milliseconds).
  std::atomic<int64_t> completed{0};
  std::atomic<bool> stop{false};
  std::atomic<int> restarted{0};
  std::atomic<bool> restarter_done{false};
  std::thread restarter([&] {
    absl::Cleanup done = [&] { restarter_done = true; };
    for (int i = 0; i < kServers && !stop; ++i) {
      while (!stop && completed < 1 + kStepsBetweenRestarts * i) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
      const std::string address = servers[i].address;
      kill(servers[i].pid, SIGTERM);
      const int status = testing::WaitExit(servers[i].pid, absl::Seconds(30));
      EXPECT_EQ(status, 0) << "server-" << i << " did not stop cleanly";
      if (status == -1) return;
      daemons.Forget(servers[i].pid);
      servers[i] = start_server(i, address);
      EXPECT_EQ(servers[i].address, address) << "server-" << i << " did not come back";
      ++restarted;
    }
  });
  std::vector<std::vector<int64_t>> steps;
  // Training waits, three steps past each restart's trigger, until that
  // restart is done: every restart lands within training, however long a
  // server takes to stop and start on a loaded machine.
  const MasterState got = Train(Job(coordinator, "rolling"), &steps, [&](int64_t step) {
    completed = step;
    const int64_t past_trigger = step - 1 - 3;
    if (past_trigger < 0 || past_trigger % kStepsBetweenRestarts != 0) return;
    const int i = static_cast<int>(past_trigger / kStepsBetweenRestarts);
    while (i < kServers && restarted <= i && !restarter_done) absl::SleepFor(absl::Milliseconds(1));
  });
  stop = true;
  restarter.join();

  EXPECT_EQ(restarted, kServers) << "training ended before every server was restarted";
  std::vector<int64_t> each_once;
  for (int64_t s = 1; s <= kSteps; ++s) each_once.push_back(s);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(steady_steps[rank], each_once) << "rank " << rank;
    EXPECT_EQ(steps[rank], each_once) << "rank " << rank;
  }
  EXPECT_EQ(got.step, kSteps);
  EXPECT_TRUE(got.params == want.params);
  EXPECT_TRUE(got.exp_avg == want.exp_avg);
  EXPECT_TRUE(got.exp_avg_sq == want.exp_avg_sq);
}

}  // namespace
}  // namespace strata
