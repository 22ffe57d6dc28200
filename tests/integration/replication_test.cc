// Replicated chunks (JobSpec.replicas) over real processes on loopback: a
// shard server lost for good (SIGKILL, never restarted) during a step costs
// a replicated job no step -- the coordinator takes the lost copies out of
// the placement, the workers re-form on the copies left and complete the
// step there -- and the weights equal an uninterrupted run, bit for bit;
// so does a server that restarts at once without its chunks. Either way the
// coordinator seeds the missing copies again while the job trains, and
// every copy ends with the primary's bits. Draining a server and
// rebalancing onto a new one move copies the same way while the job
// trains: no step lost, the same bits. Jobs with 8-bit moments too.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/client.h"
#include "testing/coordinator_calls.h"
#include "testing/job_runner.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"
#include "testing/server_kill.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSteps = 30;
// Rank 0 waits here until every chunk has its copies again.
constexpr int64_t kCopiesBackBy = 25;
constexpr int64_t kKillDuringStep = 13;
constexpr int kServerTimeoutMs = 1000;

// 2 workers that split 8 samples per step (Step(GradientFn)), FP32, with
// `replicas` copies of each chunk.
ClientOptions Job(const std::string& coordinator, const std::string& job_id, uint32_t replicas) {
  ClientOptions o = testing::SmallFp32Job(coordinator, job_id);
  o.job.samples_per_step = 8;
  o.job.replicas = replicas;
  o.initial.params = testing::InitialParams(
      FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params());
  return o;
}

// Job() with 8-bit moments in chunks of 640 (blocks of 256, 256 and 128).
ClientOptions Int8Job(const std::string& coordinator, const std::string& job_id,
                      uint32_t replicas) {
  ClientOptions o = Job(coordinator, job_id, replicas);
  o.job.state_precision = StatePrecision::kInt8;
  o.job.chunk_num_params = 640;
  return o;
}

constexpr auto Compute = testing::ParamDependentGradient;

// Compute, except that rank 0 waits before step kCopiesBackBy (up to 60 s)
// until every chunk of the job has `copies` copies, none on `not_on`.
GradientFn WaitForCopies(const std::string& coordinator, const std::string& job_id, size_t copies,
                         std::string not_on) {
  return [=](const MicroBatch& batch, Client& client) {
    if (batch.step == kCopiesBackBy && client.rank() == 0) {
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (true) {
        auto placement = testing::Placement(coordinator, job_id);
        if (placement.ok() && testing::HasCopies(*placement, copies, not_on)) break;
        if (absl::Now() > deadline) {
          ADD_FAILURE() << "the job's chunks did not get " << copies << " copies back";
          break;
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    return Compute(batch, client);
  };
}

// Runs `task` on its own thread while a job trains: rank 0 starts it
// before step `start_at` and waits for it before step `done_by`.
class WhileTraining {
 public:
  WhileTraining(int64_t start_at, int64_t done_by, std::function<void()> task,
                GradientFn gradient = Compute)
      : start_at_(start_at),
        done_by_(done_by),
        task_(std::move(task)),
        gradient_(std::move(gradient)) {}
  ~WhileTraining() {
    if (thread_.joinable()) thread_.join();
  }
  // The gradient, around which the task runs.
  GradientFn compute() {
    return [this](const MicroBatch& batch, Client& client) {
      if (client.rank() == 0 && batch.step == start_at_ && !thread_.joinable()) {
        thread_ = std::thread(task_);
      }
      if (client.rank() == 0 && batch.step == done_by_ && thread_.joinable()) thread_.join();
      return gradient_(batch, client);
    };
  }

 private:
  const int64_t start_at_, done_by_;
  const std::function<void()> task_;
  const GradientFn gradient_;
  std::thread thread_;
};

// Trains `options`' job to kSteps; during step kKillDuringStep, unless
// `victim` is null, SIGKILLs it, then runs `after_kill`. `placement`, if
// set, gets the job's placement just before the kill.
testing::KilledRun Train(
    const ClientOptions& options, testing::ServerProcess* victim, testing::Processes* daemons,
    v1::GetPlacementResponse* placement = nullptr, const std::function<void()>& after_kill = [] {},
    const GradientFn& compute = Compute) {
  testing::ServerKill kill{victim, daemons, kKillDuringStep};
  kill.before = [&] {
    if (placement == nullptr) return;
    auto got = testing::Placement(options.coordinator_address, options.job_id);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) *placement = *std::move(got);
  };
  kill.after = after_kill;
  return testing::TrainThroughAKill(options, kSteps, compute, kill);
}

// The offsets of the lines of `log` that hold both `a` and `b`.
std::vector<size_t> LinesWith(const std::string& log, const std::string& a, const std::string& b) {
  std::vector<size_t> offsets;
  for (size_t begin = 0; begin < log.size();) {
    const size_t end = std::min(log.find('\n', begin), log.size());
    const std::string_view line(log.data() + begin, end - begin);
    if (line.find(a) != line.npos && line.find(b) != line.npos) offsets.push_back(begin);
    begin = end + 1;
  }
  return offsets;
}

// A coordinator that takes a server for lost after `server_timeout_ms`, and
// three servers with 64 MiB of host memory, all in a scratch directory.
class ReplicationTest : public ::testing::Test {
 protected:
  void StartCluster(int server_timeout_ms, std::vector<std::string> coordinator_flags = {},
                    const std::vector<std::string>& server_flags = {}) {
    coordinator_flags.push_back(absl::StrCat("--server_timeout_ms=", server_timeout_ms));
    coordinator_ =
        testing::StartCoordinator(STRATA_BIN_DIR, scratch_.path(), &daemons_, coordinator_flags);
    ASSERT_FALSE(coordinator_.empty());
    for (int i = 0; i < 3; ++i) {
      servers_.push_back(StartServer(i, server_flags));
      ASSERT_FALSE(servers_.back().address.empty());
    }
  }
  testing::ServerProcess StartServer(int i, const std::vector<std::string>& flags) {
    std::vector<std::string> all = {"--host_budget_mib=64"};
    all.insert(all.end(), flags.begin(), flags.end());
    return testing::StartServer(STRATA_BIN_DIR, scratch_.path(), absl::StrCat("server-", i),
                                coordinator_, all, &daemons_);
  }

  // Every step once, none lost, and the master state of an uninterrupted
  // run of one copy (of a job like `like`, Job() by default) on the servers
  // left.
  void ExpectNothingLost(const testing::KilledRun& run,
                         std::optional<ClientOptions> like = std::nullopt) {
    std::vector<int64_t> want;
    for (int64_t s = 1; s <= kSteps; ++s) want.push_back(s);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(run.steps[rank], want) << "rank " << rank << ": every step once";
      EXPECT_EQ(run.reforms[rank].steps_lost, 0) << "rank " << rank;
    }
    ClientOptions options = like.value_or(Job(coordinator_, "", 1));
    options.job_id = "uninterrupted";
    options.job.replicas = 1;
    const testing::KilledRun uninterrupted = Train(options, nullptr, nullptr);
    EXPECT_EQ(run.master.step, kSteps);
    EXPECT_EQ(uninterrupted.master.step, kSteps);
    EXPECT_TRUE(run.master.params == uninterrupted.master.params);
    EXPECT_TRUE(run.master.exp_avg == uninterrupted.master.exp_avg);
    EXPECT_TRUE(run.master.exp_avg_sq == uninterrupted.master.exp_avg_sq);
  }

  // The workers followed every move in place: each formed its group once,
  // when it started, and never pulled every parameter or recomputed a step
  // again; and each sends to the `num_servers` servers that hold the job.
  static void ExpectFollowedInPlace(const testing::KilledRun& run, int num_servers) {
    for (size_t rank = 0; rank < run.reforms.size(); ++rank) {
      EXPECT_EQ(run.reforms[rank].count, 1) << "rank " << rank << " re-formed";
      EXPECT_EQ(run.num_servers[rank], num_servers) << "rank " << rank;
    }
  }

  // Every copy of every chunk of `job_id` at the last step, with the bits
  // of `run`'s master state (read from the primaries) and the stored bits
  // of the chunk's other copies (8-bit moments too), and `copies` of each
  // on distinct servers, none on `not_on`.
  void ExpectCopiesOf(const std::string& job_id, const testing::KilledRun& run, size_t copies,
                      const std::string& not_on) {
    auto placement = testing::Placement(coordinator_, job_id);
    ASSERT_TRUE(placement.ok()) << placement.status();
    EXPECT_TRUE(testing::HasCopies(*placement, copies, not_on));
    std::map<uint32_t, std::set<std::string>> servers_of;
    std::map<uint32_t, std::string> stored_of;
    for (const v1::PlacementRow& row : placement->rows()) {
      EXPECT_TRUE(servers_of[row.chunk_id()].insert(row.server_address()).second)
          << "two copies of chunk " << row.chunk_id() << " on " << row.server_address();
      EXPECT_EQ(row.applied_step(), kSteps) << "chunk " << row.chunk_id();
      auto state =
          testing::ReadCopy(row.server_address(), job_id, row.flat_begin(), row.num_params());
      ASSERT_TRUE(state.ok()) << state.status();
      auto slice = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + row.flat_begin(),
                                  v.begin() + row.flat_begin() + row.num_params());
      };
      const std::vector<float> p(state->params().begin(), state->params().end());
      const std::vector<float> m(state->exp_avg().begin(), state->exp_avg().end());
      const std::vector<float> v(state->exp_avg_sq().begin(), state->exp_avg_sq().end());
      EXPECT_TRUE(p == slice(run.master.params) && m == slice(run.master.exp_avg) &&
                  v == slice(run.master.exp_avg_sq))
          << "copy " << row.copy() << " of chunk " << row.chunk_id() << " on "
          << row.server_address() << " differs from the master state";
      auto stored = testing::ReadCopy(row.server_address(), job_id, row.flat_begin(),
                                      row.num_params(), /*stored=*/true);
      ASSERT_TRUE(stored.ok()) << stored.status();
      auto [first, inserted] = stored_of.emplace(row.chunk_id(), stored->stored_state());
      EXPECT_TRUE(inserted || first->second == stored->stored_state())
          << "copy " << row.copy() << " of chunk " << row.chunk_id() << " on "
          << row.server_address() << " stores other bits than copy 0";
    }
  }

  // Drains server 0 at step 10 while `job` (one copy) trains to kSteps with
  // `gradient`: every copy built while the job trained, nothing left there,
  // no re-forming, no step lost, the bits of an unstreamed run.
  void DrainWhileTraining(const ClientOptions& job, GradientFn gradient = Compute) {
    const std::string drained = servers_[0].address;
    v1::DrainServerResponse response;
    WhileTraining drain(
        10, 20,
        [&] {
          absl::Status s = testing::DrainServer(coordinator_, drained, /*cancel=*/false, &response,
                                                absl::Seconds(120));
          EXPECT_TRUE(s.ok()) << s;
        },
        std::move(gradient));
    const testing::KilledRun run = Train(
        job, nullptr, nullptr, nullptr, [] {}, drain.compute());
    ASSERT_FALSE(::testing::Test::HasFailure());
    EXPECT_EQ(response.moved().jobs(), 1u);
    EXPECT_GT(response.moved().copies(), 0u);
    // Every copy was built while the job trained, in its new chunk; the
    // fence only replayed, and came at a step boundary: no step was cut.
    EXPECT_EQ(response.moved().prepared(), response.moved().copies());
    EXPECT_EQ(response.moved().built_in_place(), response.moved().copies());
    EXPECT_EQ(response.moved().at_step_boundary(), 1u);
    std::printf(
        "drained %u chunk copies (%llu bytes, %u built while training) in %.3f s, "
        "%.3f s of it waiting for a step boundary, training paused %.3f s\n",
        response.moved().copies(), static_cast<unsigned long long>(response.moved().bytes()),
        response.moved().prepared(), response.moved().seconds(),
        response.moved().boundary_wait_seconds(), response.moved().fenced_seconds());
    ExpectCopiesOf(job.job_id, run, 1, drained);
    auto held = testing::ChunksOnServer(drained, job.job_id);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, 0);
    ExpectFollowedInPlace(run, 2);
    ExpectNothingLost(run, job);
  }

  std::string CoordinatorLog() const { return Log("coordinator"); }
  std::string ServerLog(int i) const { return Log(absl::StrCat("server-", i)); }
  std::string Log(const std::string& name) const {
    std::ifstream in(scratch_.path() + "/" + name + ".log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  const testing::ScratchDir scratch_{"replication"};
  testing::Processes daemons_;
  std::string coordinator_;
  std::vector<testing::ServerProcess> servers_;
};

TEST_F(ReplicationTest, AServerLostForGoodCostsAReplicatedJobNoStep) {
  StartCluster(kServerTimeoutMs);
  testing::ServerProcess& victim = servers_[1];
  v1::GetPlacementResponse before_kill;
  const testing::KilledRun run = Train(
      Job(coordinator_, "replicated", /*replicas=*/2), &victim, &daemons_, &before_kill, [] {},
      WaitForCopies(coordinator_, "replicated", 2, victim.address));
  ASSERT_FALSE(::testing::Test::HasFailure());

  // Before the kill every chunk had two copies on distinct servers, copy 0
  // the primary, and the victim held some.
  std::map<uint32_t, std::vector<std::string>> copies;
  for (const v1::PlacementRow& row : before_kill.rows()) {
    auto& servers_of = copies[row.chunk_id()];
    EXPECT_EQ(row.copy(), servers_of.size()) << "chunk " << row.chunk_id();
    servers_of.push_back(row.server_address());
  }
  ASSERT_FALSE(copies.empty());
  bool victim_held = false;
  for (const auto& [chunk, servers_of] : copies) {
    ASSERT_EQ(servers_of.size(), 2u) << "chunk " << chunk;
    EXPECT_NE(servers_of[0], servers_of[1]) << "chunk " << chunk;
    victim_held = victim_held || servers_of[0] == victim.address || servers_of[1] == victim.address;
  }
  EXPECT_TRUE(victim_held);
  std::printf(
      "server lost during step %lld: no step lost, job paused %.2f s (server timeout %d ms)\n",
      static_cast<long long>(kKillDuringStep), run.paused_s, kServerTimeoutMs);

  // Two copies of each chunk again, on the two live servers, at the last
  // step with the primaries' bits; one primary per chunk.
  ExpectCopiesOf("replicated", run, 2, victim.address);
  auto placement = testing::Placement(coordinator_, "replicated");
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::set<uint32_t> chunks, primaries;
  for (const v1::PlacementRow& row : placement->rows()) {
    chunks.insert(row.chunk_id());
    if (row.copy() == 0) EXPECT_TRUE(primaries.insert(row.chunk_id()).second);
  }
  EXPECT_EQ(primaries, chunks) << "one primary per chunk";
  EXPECT_THAT(CoordinatorLog(), HasSubstr("restoring its replica count"));

  // The copies' drop and their restore each moved chunks mid-step or between steps.
  ExpectFollowedInPlace(run, 2);
  ExpectNothingLost(run);
}

// The same with 8-bit moments: the copies restored on the servers left are
// read in their stored form and replay their steps with the same rounding,
// so no step is lost and every copy keeps the bits.
TEST_F(ReplicationTest, AServerLostForGoodCostsAnEightBitJobNoStep) {
  StartCluster(kServerTimeoutMs);
  testing::ServerProcess& victim = servers_[1];
  const testing::KilledRun run = Train(
      Int8Job(coordinator_, "int8", /*replicas=*/2), &victim, &daemons_, nullptr, [] {},
      WaitForCopies(coordinator_, "int8", 2, victim.address));
  ASSERT_FALSE(::testing::Test::HasFailure());
  ExpectCopiesOf("int8", run, 2, victim.address);
  EXPECT_THAT(CoordinatorLog(), HasSubstr("restoring its replica count"));
  ExpectNothingLost(run, Int8Job(coordinator_, "", 1));
}

// A server that restarts at once without its chunks (well within the server
// timeout, so never declared lost): the coordinator sees it back empty and
// takes its copies out of the placement instead of resuming the job from a
// checkpoint (it has none).
TEST_F(ReplicationTest, AServerBackWithoutItsChunksCostsAReplicatedJobNoStep) {
  StartCluster(/*server_timeout_ms=*/30000);
  testing::ServerProcess& victim = servers_[1];
  const std::string address = victim.address;
  const testing::KilledRun run = Train(
      Job(coordinator_, "replicated", 2), &victim, &daemons_, /*placement=*/nullptr,
      [&] {
        victim = StartServer(1, {"--listen=" + address});
        EXPECT_EQ(victim.address, address);
      },
      WaitForCopies(coordinator_, "replicated", 2, ""));
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::printf("server restarted empty during step %lld: job paused %.2f s\n",
              static_cast<long long>(kKillDuringStep), run.paused_s);
  const std::string log = CoordinatorLog();
  EXPECT_THAT(log, HasSubstr("(it restarted without them, or lost their state)"));
  EXPECT_THAT(log, HasSubstr("goes on from the other copies of its chunks"));
  // The restarted server may take copies again: two of each chunk.
  ExpectCopiesOf("replicated", run, 2, "");
  ExpectNothingLost(run);
}

// The same, with a drain of another server asked for the moment the
// emptied one is back -- before the coordinator has taken its copies out:
// the move must not use them (a copy made anew there would be at step 0,
// and a seed from it would spread step 0). The drain is refused by name
// until they are out, then moves the copies; no step lost, the same bits.
TEST_F(ReplicationTest, ADrainAsAServerComesBackEmptyUsesNoneOfItsCopies) {
  StartCluster(/*server_timeout_ms=*/30000);
  testing::ServerProcess& victim = servers_[1];
  const std::string address = victim.address, drained = servers_[2].address;
  std::thread drain;
  absl::Status drain_status;
  int refused = 0;
  const testing::KilledRun run = Train(
      Job(coordinator_, "replicated", 2), &victim, &daemons_, /*placement=*/nullptr,
      [&] {
        victim = StartServer(1, {"--listen=" + address});
        EXPECT_EQ(victim.address, address);
        drain = std::thread([&] {
          const absl::Time deadline = absl::Now() + absl::Seconds(60);
          do {
            v1::DrainServerResponse response;
            drain_status = testing::DrainServer(coordinator_, drained, /*cancel=*/false, &response,
                                                absl::Seconds(120));
            if (drain_status.ok()) break;
            EXPECT_THAT(drain_status.message(),
                        ::testing::AnyOf(HasSubstr("came back without its chunks"),
                                         HasSubstr("is not on this shard server")))
                << drain_status;
            ++refused;
            absl::SleepFor(absl::Milliseconds(100));
          } while (absl::Now() < deadline);
        });
      },
      WaitForCopies(coordinator_, "replicated", 2, drained));
  drain.join();
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_TRUE(drain_status.ok()) << drain_status;
  std::printf("drain refused %d time(s) while the restarted server's copies were placed\n",
              refused);
  ExpectCopiesOf("replicated", run, 2, drained);
  ExpectNothingLost(run);
}

// A one-copy job's chunks leave a server drained at step 10 while the job
// trains to 30 (each primary seeded elsewhere with its previous step's
// copy): nothing left there, no step lost, the same bits.
TEST_F(ReplicationTest, ADrainedServersChunksMoveWhileTheJobTrains) {
  StartCluster(kServerTimeoutMs);
  DrainWhileTraining(Job(coordinator_, "drained", /*replicas=*/1));
  // Each server that took copies faulted in the memory their saves take
  // once they were seeded, not while they were built beside the training.
  for (int i = 1; i < 3; ++i) {
    std::vector<size_t> faulted_in, moved, seeded;
    for (int tries = 0; tries < 200; ++tries, absl::SleepFor(absl::Milliseconds(50))) {
      const std::string log = ServerLog(i);
      faulted_in = LinesWith(log, "job drained: ", " faulted in for its checkpoints ");
      moved = LinesWith(log, "job drained: ", " chunks here (");
      seeded = LinesWith(log, "job drained: ", " chunk copies seeded from ");
      if (!seeded.empty() && !faulted_in.empty() && faulted_in.back() > seeded[0]) break;
    }
    ASSERT_EQ(seeded.size(), 1u) << ServerLog(i);
    ASSERT_FALSE(moved.empty()) << ServerLog(i);
    ASSERT_FALSE(faulted_in.empty()) << ServerLog(i);
    for (size_t at : faulted_in) {
      EXPECT_FALSE(at > moved[0] && at < seeded[0])
          << "server " << i << " faulted checkpoint memory in while it built copies:\n"
          << ServerLog(i);
    }
    EXPECT_GT(faulted_in.back(), seeded[0]) << ServerLog(i);
  }
  // A server that is not registered cannot be drained.
  v1::DrainServerResponse ignored;
  absl::Status unknown = testing::DrainServer(coordinator_, "127.0.0.1:1", /*cancel=*/false,
                                              &ignored, absl::Seconds(30));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("address"));
}

// The same on servers that keep no memory for checkpoints, where a copy
// built aside finds none: each copy is built in its new chunk all the same.
TEST_F(ReplicationTest, CopiesAreBuiltInTheirNewChunksWithNoCheckpointMemory) {
  StartCluster(kServerTimeoutMs, {}, {"--checkpoint_memory_limit_mib=0"});
  DrainWhileTraining(Job(coordinator_, "no-arena-drained", /*replicas=*/1));
}

// The same with 8-bit moments: each copy built aside replays the steps
// logged since it was read with the source's rounding.
TEST_F(ReplicationTest, AnEightBitJobsChunksMoveOffADrainedServerWithTheirBits) {
  StartCluster(kServerTimeoutMs);
  DrainWhileTraining(Int8Job(coordinator_, "int8-drained", /*replicas=*/1));
}

// The same with streamed steps: a drain's fence cuts pushes that left
// during backward; the step is pushed again from the reduced slice.
TEST_F(ReplicationTest, AStreamedJobsChunksMoveOffADrainedServerWithoutReforming) {
  StartCluster(kServerTimeoutMs);
  ClientOptions job = Job(coordinator_, "streamed-drained", /*replicas=*/1);
  job.bucket_num_params = 256;
  DrainWhileTraining(job, testing::StreamedParamDependentGradient(256));
}

// A fourth server registers at step 10 and the job is rebalanced onto it
// while it trains: copies spread, no step lost, every copy the same bits.
TEST_F(ReplicationTest, ARebalanceSpreadsCopiesOntoANewServerWhileTheJobTrains) {
  StartCluster(kServerTimeoutMs);
  std::string added;
  v1::RebalanceJobResponse response;
  WhileTraining rebalance(10, 20, [&] {
    testing::ServerProcess server = StartServer(3, {});
    added = server.address;
    absl::Status s =
        testing::RebalanceJob(coordinator_, "rebalanced", &response, absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << s;
  });
  const testing::KilledRun run = Train(
      Job(coordinator_, "rebalanced", /*replicas=*/2), nullptr, nullptr, nullptr, [] {},
      rebalance.compute());
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::printf(
      "rebalanced %u chunk copies (%u torn; %llu bytes, %u built while training) in %.3f s, "
      "training paused %.3f s\n",
      response.moved().copies(), response.moved().torn(),
      static_cast<unsigned long long>(response.moved().bytes()), response.moved().prepared(),
      response.moved().seconds(), response.moved().fenced_seconds());
  EXPECT_GT(response.moved().copies(), 0u);
  EXPECT_EQ(response.moved().prepared(), response.moved().copies());
  EXPECT_EQ(response.moved().built_in_place(), response.moved().copies());
  EXPECT_EQ(response.moved().at_step_boundary(), 1u);
  ExpectCopiesOf("rebalanced", run, 2, "");
  auto held = testing::ChunksOnServer(added, "rebalanced");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, static_cast<int>(response.moved().copies()));
  ExpectFollowedInPlace(run, 4);
  ExpectNothingLost(run);
}

// Two moves back to back while the job trains: server 0 drained, then (its
// drain cancelled) the job rebalanced onto it at once, the second move's
// generation opened tens of milliseconds after the first was followed. Both
// are followed in place -- formed once, no step lost, every copy the same
// bits. (Workers that heard of different ones of two generations are
// generation_agreement_test's.)
TEST_F(ReplicationTest, TwoMovesBackToBackAreFollowedInPlace) {
  StartCluster(kServerTimeoutMs);
  const std::string drained = servers_[0].address;
  v1::DrainServerResponse drain;
  v1::RebalanceJobResponse rebalance;
  WhileTraining moves(10, 20, [&] {
    absl::Status s =
        testing::DrainServer(coordinator_, drained, /*cancel=*/false, &drain, absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << s;
    v1::DrainServerResponse cancelled;
    s = testing::DrainServer(coordinator_, drained, /*cancel=*/true, &cancelled, absl::Seconds(30));
    EXPECT_TRUE(s.ok()) << s;
    s = testing::RebalanceJob(coordinator_, "back-to-back", &rebalance, absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << s;
  });
  const testing::KilledRun run = Train(
      Job(coordinator_, "back-to-back", /*replicas=*/1), nullptr, nullptr, nullptr, [] {},
      moves.compute());
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(drain.moved().copies(), 0u);
  EXPECT_GT(rebalance.moved().copies(), 0u);
  auto held = testing::ChunksOnServer(drained, "back-to-back");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, static_cast<int>(rebalance.moved().copies()));
  ExpectCopiesOf("back-to-back", run, 1, "");
  ExpectFollowedInPlace(run, 3);
  ExpectNothingLost(run);
}

// A worker lost between its pushes to a chunk's two copies: the copy it
// reached applied a step the other never saw. Played by hand -- a worker
// joins, pushes chunk 0's next step to its primary alone and falls silent
// -- the coordinator drops it, fences the job, finds the replica a step
// behind and seeds it from the primary: both copies end with the same bits
// at the step, and no other copy moves.
TEST_F(ReplicationTest, ACopyTornByALostWorkerIsSeededAgain) {
  StartCluster(kServerTimeoutMs, {"--worker_lease_ms=500"});
  const testing::KilledRun run = Train(Job(coordinator_, "torn", /*replicas=*/2), nullptr, nullptr);
  ASSERT_EQ(run.master.step, kSteps);
  auto placement = testing::Placement(coordinator_, "torn");
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::string primary, replica;
  uint64_t n = 0;
  for (const v1::PlacementRow& row : placement->rows()) {
    if (row.chunk_id() != 0) continue;
    (row.copy() == 0 ? primary : replica) = row.server_address();
    n = row.num_params();
  }
  ASSERT_FALSE(primary.empty() || replica.empty());

  // The trained workers' drops fence the job at newer generations a while
  // later (CheckCopies): a push they make stale is ABORTED and made again
  // in the generation of a new join.
  auto coordinator = v1::Coordinator::NewStub(MakeChannel(coordinator_));
  auto shard = v1::ShardServer::NewStub(MakeChannel(primary));
  const std::vector<float> grads(n, 0.5f);
  absl::Status pushed_status = absl::UnknownError("not pushed");
  for (int attempt = 0; attempt < 50 && !pushed_status.ok(); ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(100));
    v1::JoinJobRequest join;
    join.set_job_id("torn");
    join.set_worker_id("lost-worker");
    v1::JoinJobResponse joined;
    ASSERT_TRUE(CallUnary(coordinator.get(), &v1::Coordinator::Stub::JoinJob, join, &joined,
                          absl::Seconds(30))
                    .ok());
    v1::PushRequest push;
    push.set_job_id("torn");
    push.set_step(kSteps + 1);
    push.set_flat_begin(0);
    push.set_num_params(n);
    push.set_dtype(v1::DTYPE_FP32);
    push.set_coef(1.0f);
    push.set_grads(std::string(reinterpret_cast<const char*>(grads.data()), n * sizeof(float)));
    push.set_generation(joined.generation().number());
    v1::PushResponse pushed;
    pushed_status =
        CallUnary(shard.get(), &v1::ShardServer::Stub::Push, push, &pushed, absl::Seconds(30));
    if (!pushed_status.ok()) {
      ASSERT_EQ(pushed_status.code(), absl::StatusCode::kAborted) << pushed_status;
    }
  }
  ASSERT_TRUE(pushed_status.ok()) << pushed_status;

  // The worker's lease runs out; its torn copy is seeded again.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::map<std::string, int64_t> steps;
  while (absl::Now() < deadline) {
    placement = testing::Placement(coordinator_, "torn");
    ASSERT_TRUE(placement.ok()) << placement.status();
    for (const v1::PlacementRow& row : placement->rows()) {
      if (row.chunk_id() == 0) steps[row.server_address()] = row.applied_step();
    }
    if (steps[primary] == kSteps + 1 && steps[replica] == kSteps + 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(steps[primary], kSteps + 1);
  ASSERT_EQ(steps[replica], kSteps + 1) << "the torn copy was not seeded again";
  auto from_primary = testing::ReadCopy(primary, "torn", 0, n);
  auto from_replica = testing::ReadCopy(replica, "torn", 0, n);
  ASSERT_TRUE(from_primary.ok() && from_replica.ok());
  EXPECT_EQ(from_primary->SerializeAsString(), from_replica->SerializeAsString());
  // The step changed the primary's state: it is not the state both had.
  EXPECT_NE(std::vector<float>(from_primary->params().begin(), from_primary->params().end()),
            std::vector<float>(run.master.params.begin(), run.master.params.begin() + n));
  EXPECT_THAT(CoordinatorLog(),
              HasSubstr("0 chunk copies seeded and 1 torn by a step cut short seeded again"));
  for (const v1::PlacementRow& row : placement->rows()) {
    if (row.chunk_id() != 0) EXPECT_EQ(row.applied_step(), kSteps) << "chunk " << row.chunk_id();
  }
}

// Four servers in two zones (--zone): each chunk has a copy in each zone,
// and the placement names every server's zone.
TEST_F(ReplicationTest, CopiesSpreadOverTheServersZones) {
  coordinator_ = testing::StartCoordinator(STRATA_BIN_DIR, scratch_.path(), &daemons_, {});
  ASSERT_FALSE(coordinator_.empty());
  for (int i = 0; i < 4; ++i) {
    servers_.push_back(StartServer(i, {i < 2 ? "--zone=rack-a" : "--zone=rack-b"}));
    ASSERT_FALSE(servers_.back().address.empty());
  }
  const testing::KilledRun run =
      Train(Job(coordinator_, "zoned", /*replicas=*/2), nullptr, nullptr);
  ASSERT_EQ(run.master.step, kSteps);
  auto placement = testing::Placement(coordinator_, "zoned");
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::map<std::string, std::string> zone_of;
  for (const v1::ServerRecord& server : placement->servers()) {
    zone_of[server.address()] = server.zone();
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(zone_of[servers_[i].address], i < 2 ? "rack-a" : "rack-b") << "server-" << i;
  }
  std::map<uint32_t, std::set<std::string>> zones;
  for (const v1::PlacementRow& row : placement->rows()) {
    zones[row.chunk_id()].insert(zone_of.at(row.server_address()));
  }
  ASSERT_FALSE(zones.empty());
  for (const auto& [chunk, in] : zones) {
    EXPECT_EQ(in, (std::set<std::string>{"rack-a", "rack-b"})) << "chunk " << chunk;
  }
}

// Adds 1 to each float of every occurrence of `floats` in the writable
// memory of process `pid` (a child of this one): a fault in a server's RAM.
// Mappings over 1 GiB (a sanitizer's shadow memory) are skipped; the others
// are read 16 MiB at a time. Returns how many occurrences it changed.
int CorruptMemory(pid_t pid, const std::vector<float>& floats) {
  constexpr unsigned long long kMaxMappingBytes = 1ull << 30, kWindowBytes = 16ull << 20;
  const std::string pattern(reinterpret_cast<const char*>(floats.data()),
                            floats.size() * sizeof(float));
  std::vector<float> changed = floats;
  for (float& x : changed) x += 1.0f;
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  const int mem = open(absl::StrCat("/proc/", pid, "/mem").c_str(), O_RDWR | O_CLOEXEC);
  EXPECT_GE(mem, 0) << "cannot open the memory of process " << pid;
  if (mem < 0) return 0;
  int found = 0;
  for (std::string line; std::getline(maps, line);) {
    unsigned long long begin, end;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &begin, &end, perms) != 3) continue;
    if (perms[0] != 'r' || perms[1] != 'w' || end - begin > kMaxMappingBytes) continue;
    // Windows overlap by a pattern's bytes less one, so that none is missed.
    for (unsigned long long from = begin; from < end; from += kWindowBytes) {
      std::string window(std::min(kWindowBytes + pattern.size() - 1, end - from), '\0');
      if (pread(mem, window.data(), window.size(), static_cast<off_t>(from)) !=
          static_cast<ssize_t>(window.size())) {
        break;
      }
      for (size_t at = window.find(pattern); at != std::string::npos && at < kWindowBytes;
           at = window.find(pattern, at + 1)) {
        EXPECT_EQ(pwrite(mem, changed.data(), pattern.size(), static_cast<off_t>(from + at)),
                  static_cast<ssize_t>(pattern.size()));
        ++found;
      }
    }
  }
  close(mem);
  return found;
}

// A replica's p changes in its server's memory at step 8 (as a RAM fault
// would): the checkpoint of step 10 finds its checksum differs from its
// primary's file (DATA_LOSS, logged) and the copy is seeded again from the
// primary; no step lost, every copy ends with the uninterrupted run's bits.
TEST_F(ReplicationTest, ADivergedCopyIsFoundAtACheckpointAndSeededAgain) {
  StartCluster(kServerTimeoutMs);
  ClientOptions options = Job(coordinator_, "diverged", /*replicas=*/2);
  options.job.checkpoint_every_steps = 5;
  bool corrupted = false;
  uint32_t chunk_id = 0;
  std::string at;
  const GradientFn compute = [&](const MicroBatch& batch, Client& client) {
    if (client.rank() == 0 && batch.step == 8 && !corrupted) {
      corrupted = true;
      auto placement = testing::Placement(coordinator_, "diverged");
      EXPECT_TRUE(placement.ok()) << placement.status();
      for (const v1::PlacementRow& row : placement->rows()) {
        if (row.copy() != 1) continue;
        chunk_id = row.chunk_id();
        at = row.server_address();
        auto state = testing::ReadCopy(at, "diverged", row.flat_begin(), 16);
        EXPECT_TRUE(state.ok()) << state.status();
        pid_t pid = -1;
        for (const auto& server : servers_) {
          if (server.address == at) pid = server.pid;
        }
        EXPECT_GE(CorruptMemory(pid, {state->params().begin(), state->params().end()}), 1);
        break;
      }
    }
    if (client.rank() == 0 && batch.step == 25) {
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (CoordinatorLog().find("diverged): ") == std::string::npos && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    return Compute(batch, client);
  };
  const testing::KilledRun run = Train(
      options, nullptr, nullptr, nullptr, [] {}, compute);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::string log = CoordinatorLog();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("DATA_LOSS: job 'diverged': the copy of chunk ", chunk_id,
                                          " on shard server ", at)));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("its copy of chunk ", chunk_id, " on ", at,
                                          " diverged): 1 chunk copies seeded")));
  ExpectCopiesOf("diverged", run, 2, "");
  ExpectNothingLost(run);
}

// A job of 256 Ki bf16 params in 16 chunks of 16 Ki, two copies of each:
// beyond 2 MiB of host memory per server, most states go to NVMe.
ClientOptions NvmeJob(const std::string& coordinator, const std::string& job_id) {
  ClientOptions o = Job(coordinator, job_id, /*replicas=*/2);
  o.job.tensors = {{"w", {512, 512}}};
  o.job.chunk_num_params = 16384;
  o.job.dtype = DType::kBf16;
  o.loss_scale.dynamic = false;
  o.initial.params = testing::InitialParams(
      FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params());
  return o;
}

// Garbage over every file of `dir` (an NVMe tier's), in place.
void Corrupt(const std::string& dir) {
  const std::string garbage(1 << 20, '\x5a');
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const int fd = open(entry.path().c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << entry.path();
    for (off_t at = 0; at < static_cast<off_t>(entry.file_size()); at += garbage.size()) {
      ASSERT_GT(pwrite(fd, garbage.data(), garbage.size(), at), 0) << entry.path();
    }
    fsync(fd);
    close(fd);
  }
}

// The NVMe tier of a server is overwritten with garbage at step 10: its
// next applies find their chunks' states corrupted (DATA_LOSS), the server
// reports them lost, the job goes on from the other copies with no step
// lost, and the lost copies are seeded again; every copy ends with the
// primaries' bits, which are the uninterrupted run's.
TEST_F(ReplicationTest, ACopyCorruptedOnDiskIsFoundAndSeededAgain) {
  coordinator_ = testing::StartCoordinator(STRATA_BIN_DIR, scratch_.path(), &daemons_,
                                           {"--server_timeout_ms=1000"});
  ASSERT_FALSE(coordinator_.empty());
  for (int i = 0; i < 3; ++i) {
    const std::string nvme = absl::StrCat(scratch_.path(), "/nvme-", i);
    std::filesystem::create_directories(nvme);
    servers_.push_back(testing::StartServer(
        STRATA_BIN_DIR, scratch_.path(), absl::StrCat("server-", i), coordinator_,
        {"--host_budget_mib=2", "--nvme_dir=" + nvme, "--nvme_budget_mib=64"}, &daemons_));
    ASSERT_FALSE(servers_.back().address.empty());
  }
  WhileTraining corrupt(10, 25, [&] {
    Corrupt(absl::StrCat(scratch_.path(), "/nvme-1"));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (CoordinatorLog().find("restoring its replica count") == std::string::npos) {
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "the corrupted copies were not seeded again";
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  const ClientOptions options = NvmeJob(coordinator_, "corrupted");
  const testing::KilledRun run = Train(
      options, nullptr, nullptr, nullptr, [] {}, corrupt.compute());
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_THAT(CoordinatorLog(), HasSubstr("lost their state"));
  std::ifstream log(scratch_.path() + "/server-1.log");
  EXPECT_THAT(std::string((std::istreambuf_iterator<char>(log)), {}), HasSubstr("lost its state"));
  ExpectCopiesOf("corrupted", run, 2, "");
  // Room for the uninterrupted run of one copy, once the workers' leases end.
  v1::DeleteJobResponse deleted;
  absl::Status s;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       !(s = testing::DeleteJob(coordinator_, "corrupted", &deleted)).ok() &&
       absl::IsFailedPrecondition(s) && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(s.ok()) << s;
  ExpectNothingLost(run, options);
}

}  // namespace
}  // namespace strata
