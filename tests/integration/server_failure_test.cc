// A shard server lost for good (SIGKILL, not restarted): the coordinator
// notices (health checks), moves the job's chunks onto the live servers
// from its newest checkpoint, and the workers -- not restarted -- resume
// from that checkpoint's step. The result equals a run restored from the
// same checkpoint, bit for bit. A server that comes back after its job
// moved off it drops the chunks it brought back; one whose storage fails is
// taken out of service until it heals.
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/health.h"
#include "testing/job_runner.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"
#include "testing/server_kill.h"

namespace strata {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr int64_t kSteps = 20;
constexpr int64_t kCheckpointEvery = 5;
constexpr int64_t kKillDuringStep = 13;

// 2 workers that split 8 samples per step (Step(GradientFn)).
ClientOptions Job(const std::string& coordinator, const std::string& job_id) {
  ClientOptions o = testing::SmallFp32Job(coordinator, job_id);
  o.job.samples_per_step = 8;
  return o;
}

constexpr auto Compute = testing::ParamDependentGradient;

// A coordinator that takes a server for lost after `server_timeout_ms`, and
// `num_servers` servers "server-<i>" with 64 MiB of host memory, all in
// `dir`. An empty address: it did not come up (no server starts without the
// coordinator).
struct Cluster {
  std::string coordinator;
  std::vector<testing::ServerProcess> servers;
};
Cluster StartCluster(const std::string& dir, int server_timeout_ms, int num_servers,
                     testing::Processes* daemons) {
  Cluster cluster;
  cluster.coordinator = testing::StartCoordinator(
      STRATA_BIN_DIR, dir, daemons, {absl::StrCat("--server_timeout_ms=", server_timeout_ms)});
  for (int i = 0; i < num_servers && !cluster.coordinator.empty(); ++i) {
    cluster.servers.push_back(testing::StartServer(STRATA_BIN_DIR, dir, absl::StrCat("server-", i),
                                                   cluster.coordinator, {"--host_budget_mib=64"},
                                                   daemons));
  }
  return cluster;
}

// Trains job "failover" (checkpoints every 5 steps into `checkpoints`) to
// step 20 with two workers; during step 13 the victim is SIGKILLed, then
// `after_kill()` runs.
testing::KilledRun TrainThroughAKill(const std::string& coordinator, const std::string& checkpoints,
                                     testing::ServerProcess* victim, testing::Processes* daemons,
                                     const std::function<void()>& after_kill) {
  ClientOptions o = Job(coordinator, "failover");
  o.job.checkpoint_every_steps = kCheckpointEvery;
  o.job.checkpoint_dir = checkpoints;
  const uint64_t n = FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params();
  o.initial.params = testing::InitialParams(n);
  auto compute = [&](const MicroBatch& batch, Client& c) {
    // Step 11 waits for the checkpoint of step 10 (its directory appears
    // once complete), so that the job cannot pass step 10 before it is armed.
    for (int i = 0; batch.step == 11 && i < 600 &&
                    !std::filesystem::exists(CheckpointPath(checkpoints, "failover", 10));
         ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return Compute(batch, c);
  };
  testing::ServerKill kill{victim, daemons, kKillDuringStep};
  kill.after = after_kill;
  return testing::TrainThroughAKill(o, kSteps, compute, kill);
}

// Steps 1..12, then back to the checkpoint's step 10: 11..20 again, two
// completed steps lost; the result equals a job restored from the step-10
// checkpoint and trained to step 20.
void ExpectResumedFromStep10(const testing::KilledRun& run, const std::string& coordinator,
                             const std::string& checkpoints) {
  std::vector<int64_t> want;
  for (int64_t s = 1; s < kKillDuringStep; ++s) want.push_back(s);
  for (int64_t s = 11; s <= kSteps; ++s) want.push_back(s);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(run.steps[rank], want) << "rank " << rank;
    EXPECT_EQ(run.reforms[rank].steps_lost, kKillDuringStep - 1 - 10) << "rank " << rank;
  }
  std::printf("server lost during step %lld: %lld completed step(s) lost, job paused %.2f s\n",
              static_cast<long long>(kKillDuringStep),
              static_cast<long long>(run.reforms[0].steps_lost), run.paused_s);
  MasterState restarted;
  ClientOptions r = Job(coordinator, "restarted");
  r.initial.checkpoint = CheckpointPath(checkpoints, "failover", 10);
  testing::RunClients(r, [&](Client& client) {
    while (client.step() < kSteps) {
      absl::StatusOr<StepResult> result = client.Step(Compute);
      ASSERT_TRUE(result.ok()) << result.status();
    }
    if (client.rank() == 0) {
      auto state = client.ReadMasterState();
      ASSERT_TRUE(state.ok()) << state.status();
      restarted = *std::move(state);
    }
  });
  EXPECT_EQ(run.master.step, kSteps);
  EXPECT_EQ(restarted.step, kSteps);
  EXPECT_TRUE(run.master.params == restarted.params);
  EXPECT_TRUE(run.master.exp_avg == restarted.exp_avg);
  EXPECT_TRUE(run.master.exp_avg_sq == restarted.exp_avg_sq);
}

// Test 3: three servers, two workers, checkpoints every 5 steps; a server
// is SIGKILLed during step 13 and never restarted.
TEST(ServerFailureTest, TheJobResumesFromItsLastCheckpointOnTheLiveServers) {
  const testing::ScratchDir scratch("server_failure");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  Cluster cluster = StartCluster(dir, /*server_timeout_ms=*/3000, 3, &daemons);
  const std::string& coordinator = cluster.coordinator;
  ASSERT_FALSE(coordinator.empty());
  for (const testing::ServerProcess& server : cluster.servers) ASSERT_FALSE(server.address.empty());
  const std::string checkpoints = dir + "/checkpoints";
  testing::ServerProcess& victim = cluster.servers[1];
  const testing::KilledRun run =
      TrainThroughAKill(coordinator, checkpoints, &victim, &daemons, [] {});
  ASSERT_FALSE(::testing::Test::HasFailure());

  // Every chunk now lives on a live server, at step 20.
  auto placement = testing::Placement(coordinator, "failover");
  ASSERT_TRUE(placement.ok()) << placement.status();
  for (const v1::PlacementRow& row : placement->rows()) {
    EXPECT_NE(row.server_address(), victim.address) << "chunk " << row.chunk_id();
    EXPECT_EQ(row.applied_step(), kSteps) << "chunk " << row.chunk_id();
  }

  // A push from a worker that missed the move (generation 1) is refused by
  // the chunks' new servers, and changes nothing.
  {
    const v1::PlacementRow& row = placement->rows(0);
    auto shard = v1::ShardServer::NewStub(MakeChannel(row.server_address()));
    v1::PushRequest push;
    push.set_job_id("failover");
    push.set_step(kSteps + 1);
    push.set_generation(1);
    push.set_flat_begin(row.flat_begin());
    push.set_num_params(row.num_params());
    push.set_dtype(v1::DTYPE_FP32);
    push.set_coef(1.0f);
    push.set_grads(std::string(row.num_params() * sizeof(float), '\0'));
    v1::PushResponse response;
    absl::Status stale =
        CallUnary(shard.get(), &v1::ShardServer::Stub::Push, push, &response, absl::Seconds(30));
    EXPECT_TRUE(absl::IsAborted(stale)) << stale;
    EXPECT_THAT(std::string(stale.message()), HasSubstr("moved here for generation"));
    auto after = testing::Placement(coordinator, "failover");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->rows(0).applied_step(), kSteps);
  }
  ExpectResumedFromStep10(run, coordinator, checkpoints);
}

// Asks the coordinator for the placement of job "failover" as fast as it
// answers until destroyed, and counts the answers: moving, and those that
// say the job is not moving while its chunks are at steps more than one
// apart (a worker would take such a mix for a broken job).
class PlacementWatcher {
 public:
  explicit PlacementWatcher(std::string coordinator)
      : coordinator_(std::move(coordinator)), thread_([this] { Run(); }) {}
  ~PlacementWatcher() {
    stop_ = true;
    thread_.join();
  }
  int answers() const { return answers_; }
  int moving() const { return moving_; }
  int mixed() const { return mixed_; }

 private:
  void Run() {
    while (!stop_) {
      auto placement = testing::Placement(coordinator_, "failover");
      if (!placement.ok()) continue;
      ++answers_;
      int64_t lowest = std::numeric_limits<int64_t>::max(), highest = -1;
      for (const v1::PlacementRow& row : placement->rows()) {
        if (row.applied_step() < 0) continue;
        lowest = std::min(lowest, row.applied_step());
        highest = std::max(highest, row.applied_step());
      }
      if (placement->moving()) {
        ++moving_;
      } else if (highest > lowest + 1) {
        ++mixed_;
      }
    }
  }

  const std::string coordinator_;
  std::atomic<bool> stop_{false};
  std::atomic<int> answers_{0}, moving_{0}, mixed_{0};
  std::thread thread_;
};

// Test 2 of the routine faults: a server holding host-memory chunks is
// SIGKILLed during step 13 and restarted at once on its directories and
// address, well within the server timeout: it comes back without the job's
// chunks, and the coordinator -- which never saw it unhealthy -- has the
// job resume from its newest checkpoint by itself.
TEST(ServerFailureTest, AServerBackWithoutItsChunksHasTheJobResumeFromItsCheckpoint) {
  const testing::ScratchDir scratch("server_back_empty");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  Cluster cluster = StartCluster(dir, /*server_timeout_ms=*/60000, 3, &daemons);
  const std::string& coordinator = cluster.coordinator;
  ASSERT_FALSE(coordinator.empty());
  for (const testing::ServerProcess& server : cluster.servers) ASSERT_FALSE(server.address.empty());
  const std::string checkpoints = dir + "/checkpoints";
  testing::ServerProcess& victim = cluster.servers[1];
  const std::string address = victim.address;
  std::optional<PlacementWatcher> watcher;
  const testing::KilledRun run =
      TrainThroughAKill(coordinator, checkpoints, &victim, &daemons, [&] {
        watcher.emplace(coordinator);
        victim = testing::StartServer(STRATA_BIN_DIR, dir, "server-1", coordinator,
                                      {"--host_budget_mib=64", "--listen=" + address}, &daemons);
        EXPECT_EQ(victim.address, address);
      });
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_TRUE(watcher.has_value());
  // The move drops the job's chunks, makes them anew and loads them; while
  // it does, the placement is marked moving.
  EXPECT_EQ(watcher->mixed(), 0) << watcher->moving() << " of " << watcher->answers()
                                 << " placements marked moving";
  std::printf("%d of %d placements asked during the run marked moving\n", watcher->moving(),
              watcher->answers());
  watcher.reset();
  auto placement = testing::Placement(coordinator, "failover");
  ASSERT_TRUE(placement.ok()) << placement.status();
  for (const v1::PlacementRow& row : placement->rows()) {
    EXPECT_EQ(row.applied_step(), kSteps) << "chunk " << row.chunk_id();
  }
  std::ifstream in(dir + "/coordinator.log");
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(log, HasSubstr("(it restarted without them, or lost their state)"));
  // The chunks on the other servers had applied step 12, or 13 too.
  EXPECT_THAT(log, ContainsRegex("the job had reached step 1[23]: [23] step\\(s\\) undone"));
  ExpectResumedFromStep10(run, coordinator, checkpoints);
}

// The chunks of `job` the coordinator places on `server`.
int PlacedOn(const std::string& coordinator, const std::string& job, const std::string& server) {
  auto placement = testing::Placement(coordinator, job);
  EXPECT_TRUE(placement.ok()) << placement.status();
  int chunks = 0;
  if (placement.ok()) {
    for (const v1::PlacementRow& row : placement->rows()) chunks += row.server_address() == server;
  }
  return chunks;
}

// The chunks of `job` that `server` reports (-1 when it does not answer).
int HeldBy(const std::string& server, const std::string& job) {
  absl::StatusOr<int> chunks = testing::ChunksOnServer(server, job);
  EXPECT_TRUE(chunks.ok()) << chunks.status();
  return chunks.value_or(-1);
}

// A one-worker job `job_id` with checkpoints every 2 steps into
// `dir`/checkpoints, trained to step 2 once that checkpoint is complete.
std::unique_ptr<Client> TrainToFirstCheckpoint(const std::string& coordinator,
                                               const std::string& dir, const std::string& job_id) {
  ClientOptions o = Job(coordinator, job_id);
  o.job.world_size = 1;
  o.job.checkpoint_every_steps = 2;
  o.job.checkpoint_dir = dir + "/checkpoints";
  auto client = Client::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  while ((*client)->step() < 2) {
    absl::StatusOr<StepResult> result = (*client)->Step(Compute);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return nullptr;
  }
  const std::string checkpoint = CheckpointPath(o.job.checkpoint_dir, job_id, 2);
  for (int i = 0; i < 600 && !std::filesystem::exists(checkpoint); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(std::filesystem::exists(checkpoint));
  return *std::move(client);
}

// A server that stops cleanly (saving its host chunks) and stays away past
// the timeout loses its job to the other server; when it comes back on its
// data directory and address, it restores those chunks -- stale: the job
// lives elsewhere now -- and the coordinator has it drop them.
TEST(ServerFailureTest, AServerThatComesBackAfterItsJobMovedDropsItsStaleChunks) {
  const testing::ScratchDir scratch("server_comes_back");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  const Cluster cluster = StartCluster(dir, /*server_timeout_ms=*/2000, 2, &daemons);
  const std::string& coordinator = cluster.coordinator;
  ASSERT_FALSE(coordinator.empty());
  for (const testing::ServerProcess& server : cluster.servers) ASSERT_FALSE(server.address.empty());
  const testing::ServerProcess& victim = cluster.servers[1];
  auto victims_chunks = [&] { return HeldBy(victim.address, "moved"); };
  auto on_victim = [&] { return PlacedOn(coordinator, "moved", victim.address); };
  ASSERT_NE(TrainToFirstCheckpoint(coordinator, dir, "moved"), nullptr);
  const int victims_share = victims_chunks();
  ASSERT_GT(victims_share, 0);

  kill(victim.pid, SIGTERM);  // a clean stop: its host chunks are saved
  ASSERT_EQ(testing::WaitExit(victim.pid, absl::Seconds(30)), 0);
  daemons.Forget(victim.pid);
  for (int i = 0; i < 600 && on_victim() > 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(on_victim(), 0) << "the job did not move off the stopped server";

  const testing::ServerProcess back =
      testing::StartServer(STRATA_BIN_DIR, dir, "server-1", coordinator,
                           {"--host_budget_mib=64", "--listen=" + victim.address}, &daemons);
  ASSERT_EQ(back.address, victim.address);
  int left = victims_chunks();
  for (int i = 0; i < 200 && left > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    left = victims_chunks();
  }
  EXPECT_EQ(left, 0) << "the server kept " << left << " chunk(s) of a job that moved off it";
  // It had brought them back, and dropped them (the line follows the drop).
  auto log = [&] {
    std::ifstream in(dir + "/server-1.log");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  for (int i = 0; i < 100 && log().find("job moved: dropped") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_THAT(log(), HasSubstr(absl::StrCat("recovered job moved: 0 chunks from the nvme tier and ",
                                            victims_share, " saved at the last clean shutdown")));
  EXPECT_THAT(log(), HasSubstr("job moved: dropped"));
  EXPECT_EQ(on_victim(), 0);
  // Its checkpoint memory was faulted in when it was allocated, and again
  // when it was recovered (before the drop).
  auto prepared = [&] {
    const std::string text = log();
    int lines = 0;
    for (size_t at = 0; (at = text.find("faulted in for its checkpoints", at)) != std::string::npos;
         ++at) {
      ++lines;
    }
    return lines;
  };
  for (int i = 0; i < 100 && prepared() < 2; ++i) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(prepared(), 2) << log();
}

// Test 3 of the routine faults: a server whose storage stops taking writes
// (a file-size limit of 0 set on its process with prlimit(2): every write
// fails with EFBIG, as on a full disk) answers NOT_SERVING, and its job moves
// to the other server, where the worker -- not restarted -- trains on from
// the checkpoint. With the limit lifted ("the disk was freed") the server
// answers SERVING again and drops the stale chunks of the job that moved.
TEST(ServerFailureTest, AServerWhoseStorageFailsIsTakenOutOfServiceUntilItHeals) {
  const testing::ScratchDir scratch("storage_fails");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  const Cluster cluster = StartCluster(dir, /*server_timeout_ms=*/2000, 2, &daemons);
  const std::string& coordinator = cluster.coordinator;
  ASSERT_FALSE(coordinator.empty());
  for (const testing::ServerProcess& server : cluster.servers) ASSERT_FALSE(server.address.empty());
  const testing::ServerProcess& victim = cluster.servers[1];
  auto victims_chunks = [&] { return HeldBy(victim.address, "full"); };
  auto on_victim = [&] { return PlacedOn(coordinator, "full", victim.address); };
  auto wait_for_health = [&](HealthCheckResponse::ServingStatus want) {
    for (int i = 0; i < 200; ++i) {
      auto health = testing::HealthOf(victim.address);
      if (health.ok() && *health == want) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  };

  std::unique_ptr<Client> client = TrainToFirstCheckpoint(coordinator, dir, "full");
  ASSERT_NE(client, nullptr);
  ASSERT_GT(victims_chunks(), 0);
  ASSERT_EQ(testing::HealthOf(victim.address).value_or(HealthCheckResponse::UNKNOWN),
            HealthCheckResponse::SERVING);

  struct rlimit unlimited {};
  ASSERT_EQ(prlimit(victim.pid, RLIMIT_FSIZE, nullptr, &unlimited), 0) << std::strerror(errno);
  struct rlimit full = unlimited;
  full.rlim_cur = 0;
  ASSERT_EQ(prlimit(victim.pid, RLIMIT_FSIZE, &full, nullptr), 0) << std::strerror(errno);
  const absl::Time failed = absl::Now();
  ASSERT_TRUE(wait_for_health(HealthCheckResponse::NOT_SERVING))
      << "a server whose storage fails still answers SERVING";
  std::printf("NOT_SERVING %.2f s after its storage failed\n",
              absl::ToDoubleSeconds(absl::Now() - failed));
  for (int i = 0; i < 400 && on_victim() > 0; ++i) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(on_victim(), 0) << "the job did not move off the failed server";
  while (client->step() < 6) {
    absl::StatusOr<StepResult> result = client->Step(Compute);
    ASSERT_TRUE(result.ok()) << result.status();
  }
  EXPECT_EQ(client->last_reform().steps_lost, 0) << "it moved from the checkpoint of step 2";

  ASSERT_EQ(prlimit(victim.pid, RLIMIT_FSIZE, &unlimited, nullptr), 0) << std::strerror(errno);
  const absl::Time freed = absl::Now();
  ASSERT_TRUE(wait_for_health(HealthCheckResponse::SERVING)) << "the healed server never returned";
  std::printf("SERVING again %.2f s after its storage was freed\n",
              absl::ToDoubleSeconds(absl::Now() - freed));
  int left = victims_chunks();
  for (int i = 0; i < 200 && left != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    left = victims_chunks();
  }
  EXPECT_EQ(left, 0) << "the healed server kept chunks of a job that moved off it";
  std::ifstream in(dir + "/server-1.log");
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(log, ContainsRegex("storage takes writes again after .* \\(it had failed: "
                                 ".*File too large.*\\): SERVING"));
  auto state = client->ReadMasterState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 6);
}

}  // namespace
}  // namespace strata
