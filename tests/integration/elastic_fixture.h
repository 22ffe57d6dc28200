// ElasticTest: the fixture of the tests whose workers are processes
// (tests/integration/elastic_worker.cc) on loopback -- starting workers,
// reading the JSON lines they log per committed step, and checking that
// every step was applied once, every sample consumed once, and the master
// weights equal a single-process replay of the committed steps.
#ifndef STRATA_TESTS_INTEGRATION_ELASTIC_FIXTURE_H_
#define STRATA_TESTS_INTEGRATION_ELASTIC_FIXTURE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

inline constexpr uint64_t kSamplesPerStep = 24;
inline constexpr absl::Duration kLease = absl::Seconds(1);
inline constexpr absl::Duration kRunTimeout = absl::Seconds(240);

// How a worker ended (a waitpid status; -1: still running), for failures.
inline std::string Ending(int status) {
  if (status == -1) return "still running";
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(status));
}
inline ::testing::AssertionResult KilledBySigkill(int status) {
  if (status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << Ending(status);
}
inline ::testing::AssertionResult ExitedCleanly(int status) {
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

  // What worker `id` runs under (a command running the rest of its
  // arguments; none: it runs directly), and its flags for that place.
  virtual std::vector<std::string> WorkerLauncher(const std::string& id) { return {}; }
  virtual std::vector<std::string> WorkerPlaceFlags(const std::string& id) { return {}; }

  // Starts a worker of `job`; its JSON lines go to dir_/<id>.jsonl.
  pid_t StartWorker(const std::string& job, const std::string& id, int64_t steps,
                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = WorkerLauncher(id);
    for (std::string arg :
         {std::string(STRATA_TEST_BIN_DIR) + "/elastic_worker", "--coordinator=" + coordinator_,
          "--job=" + job, "--worker_id=" + id, absl::StrCat("--steps=", steps),
          absl::StrCat("--samples_per_step=", kSamplesPerStep),
          "--log=" + dir_ + "/" + id + ".jsonl"}) {
      args.push_back(std::move(arg));
    }
    for (std::string& flag : WorkerPlaceFlags(id)) args.push_back(std::move(flag));
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

  // The complete lines worker `id` has logged so far: a line it is still
  // writing (no newline yet; a read may see part of a write that crosses a
  // page) is left for the next call.
  std::vector<nlohmann::json> Lines(const std::string& id) {
    std::ifstream in(dir_ + "/" + id + ".jsonl");
    const std::string text(std::istreambuf_iterator<char>(in), {});
    std::vector<nlohmann::json> lines;
    for (size_t begin = 0, end; (end = text.find('\n', begin)) != std::string::npos;
         begin = end + 1) {
      lines.push_back(nlohmann::json::parse(text.substr(begin, end - begin)));
    }
    return lines;
  }

  std::string WorkerLog(const std::string& id) {
    std::ifstream in(dir_ + "/" + id + ".log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // The log of a coordinator started as a process in dir_.
  std::string CoordinatorLog() const {
    std::ifstream in(dir_ + "/coordinator.log");
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

  // A committed step as the workers logged it: its samples, and the
  // fewest workers any logged it with -- a worker that finds the step
  // completed by others while it re-formed logs its own, later generation,
  // which has more.
  struct Committed {
    uint64_t sample_begin = 0, sample_end = 0;
    int world_size = 1;
  };

  // The gradient `world_size` workers form for the samples [begin, end) at
  // `p`: each sums its share's micro-batches (elastic_worker's 4 samples,
  // from the share's start) in FP32 in order, and the shares are added in
  // rank order -- for up to 2 workers the reduce-scatter's one addition per
  // element, whose order does not matter: these are the workers' bits.
  static std::vector<float> StepGradient(const std::vector<float>& p, const Committed& step) {
    constexpr uint64_t kMicroBatchSamples = 4;
    const uint64_t batch = step.sample_end - step.sample_begin;
    const uint64_t w = static_cast<uint64_t>(step.world_size);
    std::vector<float> total(p.size(), 0.0f), share(p.size());
    for (uint64_t rank = 0; rank < w; ++rank) {
      const uint64_t begin = step.sample_begin + batch * rank / w;
      const uint64_t end = step.sample_begin + batch * (rank + 1) / w;
      std::fill(share.begin(), share.end(), 0.0f);
      for (uint64_t b = begin; b < end; b += kMicroBatchSamples) {
        const std::vector<float> g =
            testing::SumGradient(p, b, std::min(end, b + kMicroBatchSamples));
        for (size_t i = 0; i < p.size(); ++i) share[i] += g[i];
      }
      for (size_t i = 0; i < p.size(); ++i) total[i] += share[i];
    }
    return total;
  }

  // Single-process replay: steps 1..`steps`, each on the gradient of its
  // recorded samples at the parameters before it.
  static std::vector<float> Replay(const std::map<int64_t, Committed>& steps) {
    std::vector<float> p = testing::LinearInitialParams();
    std::vector<float> m(p.size(), 0.0f), v(p.size(), 0.0f), copy(p.size());
    for (const auto& [step, samples] : steps) {
      std::vector<float> g = StepGradient(p, samples);
      float coef =
          static_cast<float>(1.0 / static_cast<double>(samples.sample_end - samples.sample_begin));
      AdamUpdate(MakeAdamConstants(testing::kLinearAdam, step, coef), DType::kFp32, g.data(),
                 p.data(), m.data(), v.data(), DType::kFp32, copy.data(), p.size());
    }
    return p;
  }

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

  // Checks the committed steps the workers logged: each of 1..`last` with the
  // same samples wherever logged, together the first last * kSamplesPerStep
  // samples once each; then the master weights against the replay. Up to
  // `unlogged_allowed` steps (where faults may kill or stop every worker that
  // committed a step before any logs it) may be missing between two logged
  // ones a step's samples apart: they are replayed with those samples.
  void ExpectExactlyOnce(const std::string& job, const std::vector<std::string>& workers,
                         int64_t last, int unlogged_allowed = 0) {
    std::map<int64_t, Committed> committed;
    for (const std::string& id : workers) {
      for (const auto& line : Lines(id)) {
        const Committed logged{line["sample_begin"], line["sample_end"], line["world_size"]};
        auto [it, inserted] = committed.emplace(line["step"].get<int64_t>(), logged);
        EXPECT_TRUE(it->second.sample_begin == logged.sample_begin &&
                    it->second.sample_end == logged.sample_end)
            << "step " << it->first << " logged by " << id << " with other samples";
        it->second.world_size = std::min(it->second.world_size, logged.world_size);
      }
    }
    int unlogged = 0;
    for (int64_t step = 2; step < last; ++step) {
      auto before = committed.find(step - 1), after = committed.find(step + 1);
      if (committed.count(step) != 0 || before == committed.end() || after == committed.end() ||
          after->second.sample_begin - before->second.sample_end != kSamplesPerStep) {
        continue;
      }
      std::printf(
          "step %lld was committed but logged by no worker: replayed with samples %llu..%llu\n",
          static_cast<long long>(step), static_cast<unsigned long long>(before->second.sample_end),
          static_cast<unsigned long long>(after->second.sample_begin));
      committed[step] = {before->second.sample_end, after->second.sample_begin,
                         before->second.world_size};
      ++unlogged;
    }
    EXPECT_LE(unlogged, unlogged_allowed) << "steps logged by no worker";
    ASSERT_EQ(committed.size(), static_cast<size_t>(last));
    EXPECT_EQ(committed.begin()->first, 1);
    std::vector<int> seen(last * kSamplesPerStep, 0);
    for (const auto& [step, samples] : committed) {
      for (uint64_t i = samples.sample_begin; i < samples.sample_end; ++i) ++seen.at(i);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<long>(seen.size()))
        << "some sample of the epoch was lost or consumed twice";

    std::set<int64_t> applied;
    std::vector<float> got = MasterParams(job, &applied);
    EXPECT_EQ(applied, std::set<int64_t>{last}) << "a torn or lost step";
    std::vector<float> want = Replay(committed);
    ASSERT_EQ(got.size(), want.size());
    // Relative to the largest weight: StepGradient() has the workers' bits
    // for up to 2 workers; 3 add their shares in another order, and a step
    // logged only by a worker that did not compute it has another split.
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

}  // namespace strata

#endif  // STRATA_TESTS_INTEGRATION_ELASTIC_FIXTURE_H_
