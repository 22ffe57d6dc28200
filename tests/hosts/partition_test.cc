// Partitions across hosts: a coordinator, two shard servers and two workers,
// each in its own network namespace on an emulated cluster network
// (testing/host_network.h), while links between some of them are cut and
// healed. After each, the job must go on by itself; at the end every step
// was committed once with its samples once, and the weights equal a
// single-process replay. Run by `make hosts-test` (as root); skipped where
// namespaces cannot be made.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/host_network.h"
#include "tests/integration/elastic_fixture.h"

namespace strata {
namespace {

// Shorter than test 3's cut of the coordinator: a server silent with
// everyone else for longer must not be taken for lost.
constexpr absl::Duration kServerTimeout = absl::Seconds(8);

class PartitionTest : public ElasticTest {
 protected:
  void SetUp() override {
    if (absl::Status available = testing::HostNetwork::Available(); !available.ok()) {
      GTEST_SKIP() << available;
    }
    auto network = testing::HostNetwork::Up("cluster", {"coord", "s0", "s1", "w0", "w1"});
    ASSERT_TRUE(network.ok()) << network.status();
    network_ = *std::move(network);
    // The coordinator listens on its host's address; the servers on every
    // address of theirs, announcing the one their peers reach.
    coordinator_ = testing::StartCoordinator(
        STRATA_BIN_DIR, dir_, &processes_,
        {"--listen=" + network_->Address("coord") + ":0",
         absl::StrCat("--worker_lease_ms=", absl::ToInt64Milliseconds(kLease)),
         absl::StrCat("--server_timeout_ms=", absl::ToInt64Milliseconds(kServerTimeout))},
        network_->Launcher("coord"));
    ASSERT_FALSE(coordinator_.empty());
    for (const std::string server : {"s0", "s1"}) {
      testing::ServerProcess started =
          testing::StartServer(STRATA_BIN_DIR, dir_, server, coordinator_,
                               {"--listen=0.0.0.0:0", "--advertise=" + network_->Address(server),
                                "--host_budget_mib=64"},
                               &processes_, network_->Launcher(server));
      ASSERT_THAT(started.address, ::testing::StartsWith(network_->Address(server) + ":"));
    }
  }

  std::vector<std::string> WorkerLauncher(const std::string& id) override {
    return network_->Launcher(id);
  }
  std::vector<std::string> WorkerPlaceFlags(const std::string& id) override {
    return {"--collective_host=" + network_->Address(id)};
  }

  // Workers w0 and w1 train `job` to `steps`, 50 ms apart.
  void Train(const std::string& job, int64_t steps) {
    for (const std::string id : {"w0", "w1"}) {
      workers_.push_back(StartWorker(job, id, steps, {"--step_pause_ms=50"}));
    }
  }
  // Both workers ended cleanly; every step once.
  void ExpectDone(const std::string& job, int64_t steps) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      const std::string id = absl::StrCat("w", i);
      EXPECT_TRUE(ExitedCleanly(Wait(workers_[i]))) << id << ": " << WorkerLog(id);
    }
    ExpectExactlyOnce(job, {"w0", "w1"}, steps);
  }
  // The highest step `id` logged, and its generations.
  int64_t LastStep(const std::string& id, std::set<uint64_t>* generations = nullptr) {
    int64_t step = 0;
    for (const auto& line : Lines(id)) {
      step = std::max(step, line["step"].get<int64_t>());
      if (generations != nullptr) generations->insert(line["generation"].get<uint64_t>());
    }
    return step;
  }
  std::unique_ptr<testing::HostNetwork> network_;
  std::vector<pid_t> workers_;
};

// Test 1: a worker cut off from the coordinator, not from its peer or the
// servers, loses its lease; the other goes on alone; once the link heals the
// first joins again by itself.
TEST_F(PartitionTest, AWorkerCutOffFromTheCoordinatorRejoinsByItself) {
  Train("cut-worker", 200);
  ASSERT_TRUE(WaitForStep("w0", 10));
  ASSERT_TRUE(network_->Cut("w0", "coord").ok());
  // w1 goes on alone: steps of world size 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto alone = [&] {
    for (const auto& line : Lines("w1")) {
      if (line["world_size"] == 1) return true;
    }
    return false;
  };
  while (!alone() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(alone()) << "w1 did not go on without w0: " << WorkerLog("w1");
  const int64_t cut_at = LastStep("w1");
  ASSERT_TRUE(WaitForStep("w1", cut_at + 10));
  ASSERT_TRUE(network_->Heal("w0", "coord").ok());
  // w0 is back in a generation of two.
  const int64_t healed_at = LastStep("w1");
  ASSERT_TRUE(WaitForStep("w0", healed_at + 5)) << WorkerLog("w0");
  EXPECT_EQ(Lines("w0").back()["world_size"], 2);
  ExpectDone("cut-worker", 200);
}

// Test 2: a shard server cut off from one worker only. That worker's pushes
// and pulls wait and are sent again; no step completes without them (the
// coordinator still reaches the server, which is not lost), and the step
// completes once the link heals -- in the same generation.
TEST_F(PartitionTest, AServerCutOffFromOneWorkerCompletesTheStepOnceHealed) {
  Train("cut-server", 120);
  ASSERT_TRUE(WaitForStep("w0", 10));
  ASSERT_TRUE(network_->Cut("w0", "s1").ok());
  absl::SleepFor(absl::Seconds(1));  // a step in flight stops
  const int64_t stuck_at = LastStep("w1");
  absl::SleepFor(absl::Seconds(4));
  EXPECT_LE(LastStep("w1"), stuck_at + 1) << "steps completed without w0's pushes to s1";
  ASSERT_TRUE(network_->Heal("w0", "s1").ok());
  ASSERT_TRUE(WaitForStep("w0", stuck_at + 10)) << WorkerLog("w0");
  ExpectDone("cut-server", 120);
  std::set<uint64_t> generations;
  LastStep("w0", &generations);
  LastStep("w1", &generations);
  EXPECT_EQ(generations.size(), 1u) << "the workers re-formed: a membership change";
  EXPECT_THAT(CoordinatorLog(), ::testing::Not(::testing::HasSubstr("is lost")));
}

// Test 3: the coordinator unreachable from every other host for 20 s, longer
// than the server timeout. The workers need it for no step: training goes
// on throughout, in the same generation -- the coordinator, hearing from
// nobody, expires no lease and declares no server lost -- and everything
// goes on after.
TEST_F(PartitionTest, TrainingGoesOnWhileTheCoordinatorIsUnreachable) {
  Train("cut-coordinator", 600);
  ASSERT_TRUE(WaitForStep("w0", 10));
  for (const std::string host : {"s0", "s1", "w0", "w1"}) {
    ASSERT_TRUE(network_->Cut("coord", host).ok());
  }
  const int64_t cut_at = LastStep("w0");
  absl::SleepFor(absl::Seconds(20));
  const int64_t healed_at = LastStep("w0");
  for (const std::string host : {"s0", "s1", "w0", "w1"}) {
    ASSERT_TRUE(network_->Heal("coord", host).ok());
  }
  EXPECT_GE(healed_at - cut_at, 50) << "training stalled without the coordinator";
  ExpectDone("cut-coordinator", 600);
  std::set<uint64_t> generations;
  LastStep("w0", &generations);
  LastStep("w1", &generations);
  EXPECT_EQ(generations.size(), 1u) << "the coordinator's silence changed the membership";
  EXPECT_THAT(CoordinatorLog(), ::testing::HasSubstr("expires no lease until it does"));
  // The cut outlasts the server timeout: servers silent with everyone else
  // are not lost.
  EXPECT_THAT(CoordinatorLog(), ::testing::HasSubstr("declares no server lost until it does"));
  EXPECT_THAT(CoordinatorLog(), ::testing::Not(::testing::HasSubstr("is lost")));
}

}  // namespace
}  // namespace strata
