// Chaos: seeded random faults, one at a time, while an elastic job trains on
// a coordinator process and three shard server processes on loopback -- and
// no fault may need a person: after each, the job must make progress by
// itself. At the end every chunk (every copy of it) is at the last step,
// every step's samples were consumed once, and the weights equal a
// single-process replay of the committed steps. STRATA_CHAOS_SEED replays a
// printed seed.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/placement.h"
#include "tests/integration/elastic_fixture.h"

namespace strata {
namespace {

class ChaosTest : public ElasticTest {
 protected:
  void SetUp() override {
    const char* given = std::getenv("STRATA_CHAOS_SEED");
    seed_ = given != nullptr ? static_cast<uint32_t>(std::strtoul(given, nullptr, 10))
                             : static_cast<uint32_t>(absl::ToUnixNanos(absl::Now()));
    std::printf("chaos seed %u (STRATA_CHAOS_SEED=%u replays it)\n", seed_, seed_);
    random_.seed(seed_);
    coordinator_ = StartCoordinator();
    ASSERT_FALSE(coordinator_.empty());
    for (int i = 0; i < 3; ++i) {
      servers_.push_back(StartServer(i, ""));
      ASSERT_FALSE(servers_.back().address.empty());
    }
  }

  // On the address it had before (if any).
  std::string StartCoordinator() {
    std::vector<std::string> flags = {
        absl::StrCat("--worker_lease_ms=", absl::ToInt64Milliseconds(kLease)),
        "--server_timeout_ms=2000"};
    if (!coordinator_.empty()) flags.push_back("--listen=" + coordinator_);
    std::remove((dir_ + "/coordinator.addr").c_str());
    std::string address = testing::StartCoordinator(STRATA_BIN_DIR, dir_, &processes_, flags);
    coordinator_pid_ = processes_.pids.back();
    return address;
  }
  testing::ServerProcess StartServer(int i, const std::string& address) {
    std::vector<std::string> flags = {"--host_budget_mib=64"};
    if (!address.empty()) flags.push_back("--listen=" + address);
    return testing::StartServer(STRATA_BIN_DIR, dir_, absl::StrCat("server-", i), coordinator_,
                                flags, &processes_);
  }
  // Stops `pid` with `signal` and reaps it.
  void Stop(pid_t pid, int signal) {
    kill(pid, signal);
    testing::WaitExit(pid, absl::Seconds(30));
    processes_.Forget(pid);
  }
  int Uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  // Starts two workers of `job` that train to `steps` (or to the step
  // EndAt() names) with `flags`.
  void Begin(const std::string& job, int64_t steps, std::vector<std::string> flags) {
    job_ = job;
    steps_ = steps;
    flags.push_back("--steps_file=" + dir_ + "/last_step");
    flags_ = std::move(flags);
    for (const std::string id : {"a", "b"}) AddWorker(id);
  }
  void AddWorker(const std::string& id) {
    workers_.push_back(id);
    live_[id] = StartWorker(job_, id, steps_, flags_);
  }
  // The highest step any worker logged.
  int64_t Progress() {
    int64_t step = 0;
    for (const std::string& id : workers_) {
      for (const auto& line : Lines(id)) step = std::max(step, line["step"].get<int64_t>());
    }
    return step;
  }
  // Waits up to 60 s until the workers are `steps` past the last progress
  // seen (or at the end); false, with a failure naming `after`, if not.
  bool Progressed(int64_t steps, const std::string& after) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Progress() < std::min(last_ + steps, steps_)) {
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "no progress past step " << Progress() << " within 60 s after " << after
                      << " (seed " << seed_ << ")";
        return false;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    last_ = Progress();
    return true;
  }
  // Ends the run at `step`: every worker reads it before its next step.
  void EndAt(int64_t step) {
    const std::string path = dir_ + "/last_step";
    std::ofstream(path + ".tmp") << step << "\n";
    std::filesystem::rename(path + ".tmp", path);
    steps_ = step;
  }
  void Log(int fault, const std::string& what) {
    std::printf("fault %d at step %lld: %s\n", fault, static_cast<long long>(last_), what.c_str());
    std::fflush(stdout);
  }

  // The faults; each returns what it did.
  std::string KillWorker() {  // a worker dies; another takes its place
    auto victim = std::next(live_.begin(), Uniform(0, static_cast<int>(live_.size()) - 1));
    const std::string what = "SIGKILL of worker " + victim->first;
    Stop(victim->second, SIGKILL);
    ++worker_faults_;
    live_.erase(victim);
    AddWorker(absl::StrCat("w", workers_.size()));
    return what;
  }
  std::string StopWorker() {  // a worker hangs past its lease, then goes on
    auto victim = std::next(live_.begin(), Uniform(0, static_cast<int>(live_.size()) - 1));
    kill(victim->second, SIGSTOP);
    ++worker_faults_;
    absl::SleepFor(kLease + absl::Seconds(1));
    kill(victim->second, SIGCONT);
    return "SIGSTOP of worker " + victim->first;
  }
  std::string RestartServer(int i, int signal) {  // and at once on its address
    Stop(servers_[i].pid, signal);
    servers_[i] = StartServer(i, servers_[i].address);
    EXPECT_FALSE(servers_[i].address.empty());
    return absl::StrCat(signal == SIGKILL ? "SIGKILL" : "SIGTERM", " of server-", i,
                        ", restarted at once");
  }

  // Waits for the live workers to exit cleanly, then checks the run.
  void Finish() {
    for (const auto& [id, pid] : live_) {
      EXPECT_TRUE(ExitedCleanly(Wait(pid))) << id << " (seed " << seed_ << "): " << WorkerLog(id);
    }
    ExpectExactlyOnce(job_, workers_, steps_, worker_faults_);
  }

  uint32_t seed_ = 0;
  std::mt19937 random_;
  std::string job_;
  int64_t steps_ = 0;
  std::vector<std::string> flags_;
  std::vector<std::string> workers_;  // every worker that ever ran
  std::map<std::string, pid_t> live_;
  int64_t last_ = 0;  // the progress seen after the last fault
  // Workers killed or stopped: each may take the log of a step it committed.
  int worker_faults_ = 0;
  std::vector<testing::ServerProcess> servers_;
  pid_t coordinator_pid_ = -1;
};

// Test 5 of the routine faults: 8 faults, one at a time, while two workers
// train with checkpoints every 5 steps -- servers SIGTERMed or SIGKILLed
// and restarted at once (the job moves from its checkpoint), workers
// SIGKILLed (and replaced) or stopped past their lease, the coordinator
// restarted.
TEST_F(ChaosTest, RandomFaultsOneAtATimeNeedNoPerson) {
  Begin("chaos", 400,
        {"--checkpoint_every_steps=5", "--checkpoint_dir=" + dir_ + "/checkpoints",
         "--collective_timeout_ms=20000", "--step_pause_ms=30"});
  // Server faults are recovered from a checkpoint: the first must be complete.
  ASSERT_TRUE(Progressed(6, "the start"));
  const std::string first = CheckpointPath(dir_ + "/checkpoints", job_, 5);
  for (int i = 0; i < 600 && !std::filesystem::exists(first); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(first));
  for (int f = 1; f <= 8; ++f) {
    ASSERT_LT(last_, steps_ - 10) << "the job finished before fault " << f;
    const int kind = Uniform(0, 4);
    std::string what;
    if (kind <= 1) {
      what = RestartServer(Uniform(0, 2), kind == 0 ? SIGTERM : SIGKILL);
    } else if (kind == 2) {
      what = KillWorker();
    } else if (kind == 3) {
      what = StopWorker();
    } else {
      what = "restart of the coordinator";
      Stop(coordinator_pid_, SIGTERM);
      ASSERT_EQ(StartCoordinator(), coordinator_) << what;
    }
    Log(f, what);
    ASSERT_TRUE(Progressed(3, what));
  }
  Finish();
}

bool SameBits(const google::protobuf::RepeatedField<float>& a,
              const google::protobuf::RepeatedField<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// How long the replicated chaos runs: 3 minutes, or STRATA_CHAOS_SECONDS.
absl::Duration ChaosDuration() {
  const char* given = std::getenv("STRATA_CHAOS_SECONDS");
  return absl::Seconds(given != nullptr ? std::strtol(given, nullptr, 10) : 180);
}

// Test 5 of replicated chunks: for ChaosDuration(), at random moments, a
// shard server is SIGKILLed and stays down until its copies are seeded
// again elsewhere, or a server is SIGTERMed or SIGKILLed and restarted at
// once, or a worker is SIGKILLed (and replaced) or stopped past its lease,
// while an elastic job with two copies of each chunk trains. A server's
// fault comes only once every chunk has both copies on live servers, so no
// two copies of a chunk are ever down at once. Periodic checkpoints compare
// the copies' checksums: none may differ. At the end every copy holds the
// primary's bits at the last step, and the replay holds. The steps are
// paced (about 800 in the 3 minutes): a step torn by a fault is completed
// with other gradient bits on some chunks, and over thousands of steps of
// a converged model such differences grow past the replay's bound.
//
// It found workers that hung, re-forming for minutes: a generation that
// came while one formed was not cancelled for (worker_membership_test), and
// a forming Gloo group waited 5x the collective timeout for a peer that had
// left (GlooCollectiveTest.APeerThatLeftAfterWritingItsKeys...).
TEST_F(ChaosTest, AReplicatedJobRidesOutMinutesOfRandomFaults) {
  Begin("replicated-chaos", 1'000'000,
        {"--replicas=2", "--checkpoint_every_steps=10", "--checkpoint_dir=" + dir_ + "/checkpoints",
         "--collective_timeout_ms=20000", "--step_pause_ms=200"});
  ASSERT_TRUE(Progressed(3, "the start"));
  // Every chunk has two copies, both on live servers (up to 60 s).
  auto copies_live = [&](const std::string& after) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto placement = testing::Placement(coordinator_, job_);
      if (placement.ok()) {
        std::map<uint32_t, int> live;  // chunk id -> copies on live servers
        for (const v1::PlacementRow& row : placement->rows()) {
          live[row.chunk_id()] += row.applied_step() >= 0 && row.tier() != "missing" ? 1 : 0;
        }
        bool all = !live.empty();
        for (const auto& [chunk, n] : live) all = all && n == 2;
        if (all) return true;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "the chunks' copies were not back within 60 s after " << after << " (seed "
                  << seed_ << ")";
    return false;
  };
  const absl::Time end = absl::Now() + ChaosDuration();
  int faults = 0;
  std::string what = "the start";
  while (absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(Uniform(0, 2000)));  // a random moment
    const int kind = Uniform(0, 4);
    if (kind <= 1) {
      ASSERT_TRUE(copies_live(what));
      const int i = Uniform(0, 2);
      if (kind == 0) {
        Stop(servers_[i].pid, SIGKILL);
        what = absl::StrCat("SIGKILL of server-", i, ", back once its copies are seeded again");
        ASSERT_TRUE(Progressed(2, what));
        ASSERT_TRUE(copies_live(what));
        servers_[i] = StartServer(i, servers_[i].address);
        ASSERT_FALSE(servers_[i].address.empty()) << what;
      } else {
        what = RestartServer(i, Uniform(0, 1) == 0 ? SIGTERM : SIGKILL);
      }
    } else if (kind == 2) {
      what = KillWorker();
    } else {
      what = StopWorker();
    }
    Log(++faults, what);
    ASSERT_TRUE(Progressed(2, what));
  }
  EXPECT_GE(faults, 10) << "too few faults for a chaos test";
  ASSERT_TRUE(copies_live("the last fault"));
  EndAt(Progress() + 10);
  Finish();
  // Every copy at the last step with the primary's bits.
  auto placement = testing::Placement(coordinator_, job_);
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::map<uint32_t, v1::ReadStateResponse> primary;
  for (int copy = 0; copy < 2; ++copy) {
    for (const v1::PlacementRow& row : placement->rows()) {
      if (static_cast<int>(row.copy()) != copy) continue;
      EXPECT_EQ(row.applied_step(), steps_) << "chunk " << row.chunk_id() << " copy " << copy;
      auto state =
          testing::ReadCopy(row.server_address(), job_, row.flat_begin(), row.num_params());
      ASSERT_TRUE(state.ok()) << state.status();
      if (copy == 0) {
        primary[row.chunk_id()] = *std::move(state);
        continue;
      }
      const v1::ReadStateResponse& want = primary.at(row.chunk_id());
      EXPECT_TRUE(SameBits(state->params(), want.params()) &&
                  SameBits(state->exp_avg(), want.exp_avg()) &&
                  SameBits(state->exp_avg_sq(), want.exp_avg_sq()))
          << "the replica of chunk " << row.chunk_id() << " on " << row.server_address()
          << " differs from its primary (seed " << seed_ << ")";
    }
  }
  EXPECT_EQ(primary.size() * 2, static_cast<size_t>(placement->rows_size()));
  const std::string log = CoordinatorLog();
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("DATA_LOSS")))
      << "a replica diverged (seed " << seed_ << ")";
  // How often a step cut short had torn a chunk's copies apart (seeded
  // again at a fence, before a checkpoint could find them).
  int torn = 0;
  static const std::regex kTorn("and ([0-9]+) torn by a step cut short");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kTorn); it != std::sregex_iterator();
       ++it) {
    torn += std::stoi((*it)[1].str());
  }
  std::printf("%d torn cop%s seeded again\n", torn, torn == 1 ? "y" : "ies");
}

}  // namespace
}  // namespace strata
