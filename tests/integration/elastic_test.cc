// Elastic workers as separate processes on loopback (tests/integration/
// elastic_worker.cc): workers join, leave and die while a job runs; the
// survivors never restart, every step is applied exactly once and never
// torn, every sample of the epoch is consumed once, and the final master
// weights equal a single-process replay of the committed steps.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "gtest/gtest.h"
#include "kernels/adam.h"
#include "nlohmann/json.hpp"
#include "rpc/grpc_util.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/linear_model.h"
#include "testing/local_cluster.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr uint64_t kSamplesPerStep = 24;
constexpr absl::Duration kLease = absl::Seconds(1);
constexpr absl::Duration kRunTimeout = absl::Seconds(240);

// How a worker ended (a waitpid status; -1: still running), for failures.
std::string Ending(int status) {
  if (status == -1) return "still running";
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}
::testing::AssertionResult KilledBySigkill(int status) {
  if (status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << Ending(status);
}
::testing::AssertionResult ExitedCleanly(int status) {
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << Ending(status);
}

class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions options;
    options.num_servers = 2;
    options.worker_lease = lease_;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    coordinator_ = cluster_->coordinator_address();
  }

  // Starts a worker of `job`; its JSON lines go to dir_/<id>.jsonl.
  pid_t StartWorker(const std::string& job, const std::string& id, int64_t steps,
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {std::string(STRATA_TEST_BIN_DIR) + "/elastic_worker",
                                     "--coordinator=" + coordinator_,
                                     "--job=" + job,
                                     "--worker_id=" + id,
                                     absl::StrCat("--steps=", steps),
                                     absl::StrCat("--samples_per_step=", kSamplesPerStep),
                                     "--log=" + dir_ + "/" + id + ".jsonl"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_t pid = testing::Spawn(args, dir_ + "/" + id + ".log");
    processes_.pids.push_back(pid);
    return pid;
  }

  // Waits for a worker's exit; returns its waitpid status (-1: still running).
  int Wait(pid_t pid) {
    int status = testing::WaitExit(pid, kRunTimeout);
    if (status != -1) processes_.Forget(pid);
    return status;
  }

  std::vector<nlohmann::json> Lines(const std::string& id) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir_ + "/" + id + ".jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  std::string WorkerLog(const std::string& id) {
    std::ifstream in(dir_ + "/" + id + ".log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Waits until worker `id` has logged step `step`.
  bool WaitForStep(const std::string& id, int64_t step) {
    absl::Time deadline = absl::Now() + kRunTimeout;
    while (absl::Now() < deadline) {
      auto lines = Lines(id);
      if (!lines.empty() && lines.back()["step"].get<int64_t>() >= step) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // FP32 master weights of `job` and the applied step of every chunk, read
  // from the shard servers.
  std::vector<float> MasterParams(const std::string& job, std::set<int64_t>* applied_steps) {
    auto coordinator = v1::Coordinator::NewStub(MakeChannel(coordinator_));
    v1::GetJobRequest get;
    get.set_job_id(job);
    v1::JobInfo info;
    EXPECT_TRUE(
        CallUnary(coordinator.get(), &v1::Coordinator::Stub::GetJob, get, &info, absl::Seconds(10))
            .ok());
    std::vector<float> params(info.flat_num_params());
    for (const auto& c : info.chunks()) {
      auto shard = v1::ShardServer::NewStub(MakeChannel(c.server_address()));
      v1::ReadStateRequest read;
      read.set_job_id(job);
      read.set_flat_begin(c.chunk().flat_begin());
      read.set_num_params(c.chunk().num_params());
      v1::ReadStateResponse state;
      EXPECT_TRUE(
          CallUnary(shard.get(), &v1::ShardServer::Stub::ReadState, read, &state, absl::Seconds(10))
              .ok());
      std::copy(state.params().begin(), state.params().end(),
                params.begin() + c.chunk().flat_begin());
      applied_steps->insert(state.applied_step());
    }
    return params;
  }

  // Single-process replay: steps 1..`steps`, each on the gradient of its
  // recorded samples at the parameters before it.
  static std::vector<float> Replay(const std::map<int64_t, std::pair<uint64_t, uint64_t>>& steps) {
    std::vector<float> p = testing::LinearInitialParams();
    std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f), copy(p.size());
    for (const auto& [step, samples] : steps) {
      std::vector<float> g = testing::SumGradient(p, samples.first, samples.second);
      float coef = static_cast<float>(1.0 / static_cast<double>(samples.second - samples.first));
      AdamUpdate(MakeAdamConstants(testing::kLinearAdam, step, coef), DType::kFp32, g.data(),
                 p.data(), m.data(), v.data(), DType::kFp32, copy.data(), p.size());
    }
    return p;
  }

  // Checks the committed steps the workers logged: each of 1..`last` with the
  // same samples wherever logged, together the first last * kSamplesPerStep
  // samples once each; then the master weights against the replay.
  // Workers a and b train `job` for 20 steps with `flags`; b is killed
  // once pushes of step 10 reached a server. Expects a to complete that step
  // (or 11, if the kill came late) alone and every step exactly once;
  // returns how long after its step before a completed it (ms; -1 after a
  // failure).
  int64_t KillOneInStep10(const std::string& job, const std::vector<std::string>& flags) {
    std::vector<std::string> b_flags = flags;
    b_flags.push_back("--die_in_step=10");
    pid_t a = StartWorker(job, "a", 20, flags);
    pid_t b = StartWorker(job, "b", 20, b_flags);
    EXPECT_TRUE(KilledBySigkill(Wait(b))) << WorkerLog("b");
    EXPECT_TRUE(ExitedCleanly(Wait(a))) << WorkerLog("a");
    std::vector<nlohmann::json> lines = Lines("a");
    EXPECT_EQ(lines.size(), 20u) << WorkerLog("a");
    if (lines.size() != 20u) return -1;
    int64_t fatal = 10;
    if (lines.at(fatal - 1)["world_size"] == 2) ++fatal;
    EXPECT_EQ(lines.at(fatal - 1)["world_size"], 1);
    const int64_t pause_ms = lines.at(fatal - 1)["unix_ms"].get<int64_t>() -
                             lines.at(fatal - 2)["unix_ms"].get<int64_t>();
    std::printf("worker b died in step %lld; a completed it %lld ms after its step before\n",
                static_cast<long long>(fatal), static_cast<long long>(pause_ms));
    ExpectExactlyOnce(job, {"a", "b"}, 20);
    return pause_ms;
  }

  void ExpectExactlyOnce(const std::string& job, const std::vector<std::string>& workers,
                         int64_t last) {
    std::map<int64_t, std::pair<uint64_t, uint64_t>> committed;
    for (const std::string& id : workers) {
      for (const auto& line : Lines(id)) {
        std::pair<uint64_t, uint64_t> samples{line["sample_begin"], line["sample_end"]};
        auto [it, inserted] = committed.emplace(line["step"].get<int64_t>(), samples);
        EXPECT_EQ(it->second, samples) << "step " << it->first << " logged by " << id;
      }
    }
    ASSERT_EQ(committed.size(), static_cast<size_t>(last));
    EXPECT_EQ(committed.begin()->first, 1);
    std::vector<int> seen(last * kSamplesPerStep, 0);
    for (const auto& [step, samples] : committed) {
      for (uint64_t i = samples.first; i < samples.second; ++i) ++seen.at(i);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()))
        << "some sample of the epoch was lost or consumed twice";

    std::set<int64_t> applied;
    std::vector<float> got = MasterParams(job, &applied);
    EXPECT_EQ(applied, std::set<int64_t>{last}) << "a torn or lost step";
    std::vector<float> want = Replay(committed);
    ASSERT_EQ(got.size(), want.size());
    // Relative to the largest weight: the sums of a step's gradients were
    // added in another order (per worker, then across workers).
    double max_diff = 0.0, max_weight = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(double{got[i]} - want[i]));
      max_weight = std::max(max_weight, std::abs(double{want[i]}));
    }
    double max_error = max_diff / max_weight;
    EXPECT_LE(max_error, 1e-6);
    std::printf("max relative error against the replay: %.3g\n", max_error);
  }

  const testing::ScratchDir scratch_{"elastic_test"};
  const std::string& dir_ = scratch_.path();
  absl::Duration lease_ = kLease;
  std::unique_ptr<LocalCluster> cluster_;  // none where the daemons are processes
  std::string coordinator_;
  testing::Processes processes_;
};

TEST_F(ElasticTest, JoinLeaveAndKillWhileTheSurvivorsTrainOn) {
  const std::string job = "elastic";
  pid_t a = StartWorker(job, "a", 40);
  pid_t b = StartWorker(job, "b", 40, {"--leave_after_step=20"});
  ASSERT_TRUE(WaitForStep("a", 10)) << WorkerLog("a");
  pid_t c = StartWorker(job, "c", 40, {"--die_in_step=30"});
  ASSERT_TRUE(WaitForStep("c", 15)) << WorkerLog("c");
  {
    // What `stratactl members` shows: three members of the live generation,
    // ranks 0..2, each heartbeating and counting its steps.
    auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    v1::ListMembersRequest list;
    list.set_job_id(job);
    v1::ListMembersResponse members;
    ASSERT_TRUE(CallUnary(stub.get(), &v1::Coordinator::Stub::ListMembers, list, &members,
                          absl::Seconds(10))
                    .ok());
    EXPECT_GE(members.generation().number(), 2u);
    EXPECT_EQ(members.world_size(), 3u);
    std::set<uint32_t> ranks;
    for (const v1::Member& m : members.members()) {
      EXPECT_TRUE(m.in_generation()) << m.worker_id();
      ranks.insert(m.rank());
      EXPECT_GT(m.last_heartbeat_unix_ms(), 0) << m.worker_id();
      EXPECT_NE(m.address().find(':'), std::string::npos) << m.address();
    }
    EXPECT_EQ(ranks, (std::set<uint32_t>{0, 1, 2}));
  }
  EXPECT_TRUE(ExitedCleanly(Wait(b))) << WorkerLog("b");
  EXPECT_TRUE(KilledBySigkill(Wait(c))) << WorkerLog("c");
  EXPECT_TRUE(ExitedCleanly(Wait(a))) << WorkerLog("a");

  // Worker a never restarted: one process logged every step, in order.
  std::vector<nlohmann::json> lines = Lines("a");
  ASSERT_EQ(lines.size(), 40u) << WorkerLog("a");
  std::set<int> world_sizes;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(lines[i]["pid"], lines[0]["pid"]);
    world_sizes.insert(lines[i]["world_size"].get<int>());
  }
  // It trained with 2, then 3 (c joined), 2 (b left) and 1 worker (c died).
  EXPECT_EQ(world_sizes, (std::set<int>{1, 2, 3}));
  EXPECT_EQ(lines.back()["world_size"], 1);
  std::vector<nlohmann::json> c_lines = Lines("c");
  ASSERT_FALSE(c_lines.empty());
  EXPECT_EQ(c_lines.front()["world_size"], 3);
  // c died in the step after its last logged one (30, unless the kill came
  // late), once pushes of it had reached a server -- or, if the kill came
  // after its step completed but before it logged it, in the step after.
  // a completed the interrupted step in the next generation, alone (after
  // computing it again, unless c died at the step boundary).
  int64_t fatal = c_lines.back()["step"].get<int64_t>() + 1;
  if (lines.at(fatal - 1)["world_size"] == 2) ++fatal;
  EXPECT_TRUE(fatal >= 30 && fatal <= 32) << fatal;
  const nlohmann::json& recovered = lines.at(fatal - 1);
  EXPECT_EQ(recovered["world_size"], 1);
  std::printf(
      "worker c died in step %lld; a completed it in %d attempt(s), %lld ms after its "
      "step before\n",
      static_cast<long long>(fatal), recovered["attempts"].get<int>(),
      static_cast<long long>(recovered["unix_ms"].get<int64_t>() -
                             lines.at(fatal - 2)["unix_ms"].get<int64_t>()));
  ExpectExactlyOnce(job, {"a", "b", "c"}, 40);
}

// A worker stopped (SIGSTOP) past its lease is dropped when the lease runs
// out: its peer's collectives with it are aborted then, not after the
// collective timeout, and the peer trains on alone. Continued (SIGCONT), the
// worker finds its lease lost, joins again and both finish the job, every
// step once.
TEST_F(ElasticTest, AStoppedWorkerIsDroppedAndJoinsAgainWhenContinued) {
  const std::string job = "hang";
  const absl::Duration collective_timeout = absl::Seconds(3);
  // Paced, so that a does not finish its 30 steps alone before b is back.
  const std::vector<std::string> flags = {
      absl::StrCat("--collective_timeout_ms=", absl::ToInt64Milliseconds(collective_timeout)),
      "--step_pause_ms=50"};
  pid_t a = StartWorker(job, "a", 40, flags);
  pid_t b = StartWorker(job, "b", 40, flags);
  ASSERT_TRUE(WaitForStep("b", 10)) << WorkerLog("b");
  ASSERT_EQ(kill(b, SIGSTOP), 0);
  const int64_t stopped_ms = absl::ToUnixMillis(absl::Now());
  int64_t alone_ms = 0;  // when a completed its first step alone
  for (absl::Time deadline = absl::Now() + kRunTimeout; alone_ms == 0 && absl::Now() < deadline;) {
    for (const nlohmann::json& line : Lines("a")) {
      if (line["world_size"] == 1 && line["unix_ms"].get<int64_t>() > stopped_ms) {
        alone_ms = line["unix_ms"].get<int64_t>();
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_GT(alone_ms, 0) << WorkerLog("a");
  std::printf("worker b stopped; a completed a step alone %lld ms later (lease %lld ms)\n",
              static_cast<long long>(alone_ms - stopped_ms),
              static_cast<long long>(absl::ToInt64Milliseconds(kLease)));
  EXPECT_LT(alone_ms - stopped_ms, absl::ToInt64Milliseconds(kLease + absl::Seconds(1)));
  ASSERT_EQ(kill(b, SIGCONT), 0);
  EXPECT_TRUE(ExitedCleanly(Wait(a))) << WorkerLog("a");
  EXPECT_TRUE(ExitedCleanly(Wait(b))) << WorkerLog("b");
  EXPECT_EQ(Lines("b").back()["world_size"], 2) << "b trained with a again";
  ExpectExactlyOnce(job, {"a", "b"}, 40);
}

// Workers with a lease of a minute: a worker that dies is dropped when its
// generation stream closes (and no new one opens), not when its lease runs out.
class LongLeaseElasticTest : public ElasticTest {
 protected:
  LongLeaseElasticTest() { lease_ = absl::Seconds(60); }
};

TEST_F(LongLeaseElasticTest, ACrashedWorkerIsDroppedAtOnce) {
  const int64_t pause_ms = KillOneInStep10("crash", {});
  EXPECT_LT(pause_ms, 10000) << "a waited for b's lease (60 s)";
}

// The same with streamed steps: b dies once pushes of step 10 are staged,
// mid-stream (its gradients leave during its micro-batches' last one).
TEST_F(LongLeaseElasticTest, AWorkerKilledMidStreamLosesNothing) {
  KillOneInStep10("crash-streamed", {"--stream"});
}

TEST_F(ElasticTest, EveryWorkerKilledAfterAStepThenNewOnesLoseNothing) {
  const std::string job = "elastic-restart";
  pid_t a = StartWorker(job, "a", 16, {"--die_after_step=8"});
  pid_t b = StartWorker(job, "b", 16, {"--die_after_step=8"});
  EXPECT_TRUE(KilledBySigkill(Wait(a))) << WorkerLog("a");
  EXPECT_TRUE(KilledBySigkill(Wait(b))) << WorkerLog("b");
  pid_t a2 = StartWorker(job, "a2", 16);
  pid_t b2 = StartWorker(job, "b2", 16);
  EXPECT_TRUE(ExitedCleanly(Wait(a2))) << WorkerLog("a2");
  EXPECT_TRUE(ExitedCleanly(Wait(b2))) << WorkerLog("b2");
  // Either new worker may join first and take step 9 alone: the dead ones
  // are dropped as their connections close, not a lease later.
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const std::string& id : {"a2", "b2"}) {
    std::vector<nlohmann::json> lines = Lines(id);
    if (!lines.empty()) first = std::min(first, lines.front()["step"].get<int64_t>());
  }
  EXPECT_EQ(first, 9) << "the new workers start after the last step";
  ExpectExactlyOnce(job, {"a", "b", "a2", "b2"}, 16);
}

// Test 5 of the routine faults: a seeded sequence of faults, one at a time,
// while an elastic job of two workers trains on three shard server
// processes with checkpoints every 5 steps -- servers SIGTERMed or SIGKILLed
// and restarted at once, workers SIGKILLed (and replaced) or stopped past
// their lease, the coordinator restarted. No fault may need a person: after
// each the job must make progress by itself. At the end every chunk is at
// the last step, every step's samples were consumed once, and the weights
// equal a replay of the committed steps.
class ChaosTest : public ElasticTest {
 protected:
  void SetUp() override {
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
  // The highest step any worker logged.
  int64_t Progress(const std::vector<std::string>& workers) {
    int64_t step = 0;
    for (const std::string& id : workers) {
      for (const auto& line : Lines(id)) step = std::max(step, line["step"].get<int64_t>());
    }
    return step;
  }

  std::vector<testing::ServerProcess> servers_;
  pid_t coordinator_pid_ = -1;
};

TEST_F(ChaosTest, RandomFaultsOneAtATimeNeedNoPerson) {
  constexpr int64_t kSteps = 400;
  constexpr int kFaults = 8;
  const std::string job = "chaos";
  // STRATA_CHAOS_SEED replays a run.
  const char* given = std::getenv("STRATA_CHAOS_SEED");
  const uint32_t seed = given != nullptr ? static_cast<uint32_t>(std::strtoul(given, nullptr, 10))
                                         : static_cast<uint32_t>(absl::ToUnixNanos(absl::Now()));
  std::printf("chaos seed %u (STRATA_CHAOS_SEED=%u replays it)\n", seed, seed);
  std::mt19937 random(seed);
  const std::vector<std::string> flags = {"--checkpoint_every_steps=5",
                                          "--checkpoint_dir=" + dir_ + "/checkpoints",
                                          "--collective_timeout_ms=20000", "--step_pause_ms=30"};
  std::vector<std::string> workers = {"a", "b"};
  std::map<std::string, pid_t> live = {{"a", StartWorker(job, "a", kSteps, flags)},
                                       {"b", StartWorker(job, "b", kSteps, flags)}};
  int64_t last = 0;
  auto progressed = [&](int64_t steps, const std::string& after) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Progress(workers) < std::min(last + steps, kSteps)) {
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "no progress past step " << Progress(workers) << " within 60 s after "
                      << after << " (seed " << seed << ")";
        return false;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    last = Progress(workers);
    return true;
  };
  // Server faults are recovered from a checkpoint: the first must be complete.
  ASSERT_TRUE(progressed(6, "the start"));
  for (int i = 0;
       i < 600 && !std::filesystem::exists(CheckpointPath(dir_ + "/checkpoints", job, 5)); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(CheckpointPath(dir_ + "/checkpoints", job, 5)));
  for (int f = 0; f < kFaults; ++f) {
    ASSERT_LT(last, kSteps - 10) << "the job finished before fault " << f + 1;
    const int kind = std::uniform_int_distribution<int>(0, 4)(random);
    std::string what;
    if (kind <= 1) {  // a server stops (cleanly or not) and restarts at once
      const int i = std::uniform_int_distribution<int>(0, 2)(random);
      what = absl::StrCat(kind == 0 ? "SIGTERM" : "SIGKILL", " of server-", i);
      Stop(servers_[i].pid, kind == 0 ? SIGTERM : SIGKILL);
      servers_[i] = StartServer(i, servers_[i].address);
      ASSERT_FALSE(servers_[i].address.empty()) << what;
    } else if (kind == 2) {  // a worker dies; another takes its place
      auto victim = std::next(live.begin(), std::uniform_int_distribution<int>(0, 1)(random));
      what = "SIGKILL of worker " + victim->first;
      Stop(victim->second, SIGKILL);
      live.erase(victim);
      const std::string id = absl::StrCat("w", workers.size());
      workers.push_back(id);
      live[id] = StartWorker(job, id, kSteps, flags);
    } else if (kind == 3) {  // a worker hangs past its lease, then goes on
      auto victim = std::next(live.begin(), std::uniform_int_distribution<int>(0, 1)(random));
      what = "SIGSTOP of worker " + victim->first;
      kill(victim->second, SIGSTOP);
      absl::SleepFor(kLease + absl::Seconds(1));
      kill(victim->second, SIGCONT);
    } else {  // the coordinator restarts
      what = "restart of the coordinator";
      Stop(coordinator_pid_, SIGTERM);
      ASSERT_EQ(StartCoordinator(), coordinator_) << what;
    }
    std::printf("fault %d at step %lld: %s\n", f + 1, static_cast<long long>(last), what.c_str());
    std::fflush(stdout);
    ASSERT_TRUE(progressed(3, what));
  }
  for (const auto& [id, pid] : live) {
    EXPECT_TRUE(ExitedCleanly(Wait(pid))) << id << " (seed " << seed << "): " << WorkerLog(id);
  }
  ExpectExactlyOnce(job, workers, kSteps);
}

}  // namespace
}  // namespace strata
