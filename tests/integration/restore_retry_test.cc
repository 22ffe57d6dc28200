// Work the coordinator cannot finish where it would put it -- the only
// server with room refuses every chunk -- is tried again with a doubling
// backoff and its failure logged once: a replicated job's lost copies
// (which keeps training from the copies left) and a job of one copy
// resuming from its checkpoint after its server was lost. A server that
// registers is tried at once, whatever the backoff, and takes the copies.
// Real coordinator and shard server processes on loopback; the refusing
// server is a gRPC service in the test that answers health checks and
// refuses every chunk.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"
#include "testing/server_kill.h"

namespace strata {
namespace {

constexpr int64_t kSteps = 30;
constexpr int64_t kKillDuringStep = 13;
// How long refusals are watched: with delays of 1, 2, 4 and 8 s
// after the first, it is tried 5 times in it (at 0, 1, 3, 7 and 15 s; the
// next at 31 s), and would be at every round of health checks (every
// 250 ms) without a backoff.
constexpr absl::Duration kWatched = absl::Seconds(17);

// A shard server that is healthy, holds nothing and refuses every chunk it
// is asked to make or seed. Records when it was asked to make chunks.
class RefusingShardServer final : public v1::ShardServer::CallbackService {
 public:
  grpc::ServerUnaryReactor* AllocateChunks(grpc::CallbackServerContext* context,
                                           const v1::AllocateChunksRequest*,
                                           v1::AllocateChunksResponse*) override {
    absl::MutexLock lock(&mu_);
    allocations_.push_back(absl::Now());
    return FinishUnary(context,
                       absl::ResourceExhaustedError("refused: this server makes no chunk"));
  }
  grpc::ServerUnaryReactor* SeedChunks(grpc::CallbackServerContext* context,
                                       const v1::SeedChunksRequest*,
                                       v1::SeedChunksResponse*) override {
    return FinishUnary(context,
                       absl::ResourceExhaustedError("refused: this server seeds no chunk"));
  }
  grpc::ServerUnaryReactor* ListChunks(grpc::CallbackServerContext* context,
                                       const v1::ListChunksRequest*,
                                       v1::ListChunksResponse*) override {
    return FinishUnary(context, absl::OkStatus());
  }
  std::vector<absl::Time> allocations() const {
    absl::MutexLock lock(&mu_);
    return allocations_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<absl::Time> allocations_ ABSL_GUARDED_BY(mu_);
};

class RestoreRetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_ = testing::StartCoordinator(STRATA_BIN_DIR, scratch_.path(), &daemons_,
                                             {"--server_timeout_ms=1000"});
    ASSERT_FALSE(coordinator_.empty());
  }
  void TearDown() override {
    if (refusing_server_ != nullptr) refusing_server_->Shutdown();
  }

  testing::ServerProcess StartServer(const std::string& name, const std::string& zone) {
    return testing::StartServer(STRATA_BIN_DIR, scratch_.path(), name, coordinator_,
                                {"--host_budget_mib=64", "--zone=" + zone}, &daemons_);
  }

  // Starts the refusing server and registers it, in `zone`, with room for
  // any copy of the test's job.
  void StartRefusingServer(const std::string& zone) {
    grpc::EnableDefaultHealthCheckService(true);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&refusing_);
    refusing_server_ = builder.BuildAndStart();
    ASSERT_NE(refusing_server_, nullptr);
    refusing_address_ = absl::StrCat("127.0.0.1:", port);
    auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator_));
    v1::RegisterServerRequest request;
    request.mutable_server()->set_address(refusing_address_);
    request.mutable_server()->set_host_budget_bytes(64 << 20);
    request.mutable_server()->set_zone(zone);
    v1::RegisterServerResponse response;
    const absl::Status registered = CallUnary(stub.get(), &v1::Coordinator::Stub::RegisterServer,
                                              request, &response, absl::Seconds(10));
    ASSERT_TRUE(registered.ok()) << registered;
  }

  // The times the refusing server refused to make chunks, from the first
  // (awaited up to 20 s) to kWatched after it.
  std::vector<absl::Time> WatchRefusals() {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (refusing_.allocations().empty() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (refusing_.allocations().empty()) return {};
    const absl::Time first = refusing_.allocations().front();
    absl::SleepFor(first + kWatched - absl::Now());
    std::vector<absl::Time> tried = refusing_.allocations();
    std::string times;
    for (absl::Time t : tried) absl::StrAppend(&times, " ", absl::ToDoubleSeconds(t - first));
    std::printf("refused %zu times in %.0f s, at (s after the first):%s\n", tried.size(),
                absl::ToDoubleSeconds(kWatched), times.c_str());
    return tried;
  }

  // `tried` (WatchRefusals) backed off: tried again, each time after a
  // longer wait; and the refusal is in the coordinator log once, in a line
  // with `logged_as`.
  void ExpectBackedOff(const std::vector<absl::Time>& tried, const std::string& logged_as) {
    ASSERT_FALSE(tried.empty()) << "the coordinator never tried";
    EXPECT_GE(tried.size(), 4u) << "tried again";
    EXPECT_LE(tried.size(), 6u) << "the retries back off";
    for (size_t i = 2; i < tried.size(); ++i) {
      EXPECT_GT(tried[i] - tried[i - 1], tried[i - 1] - tried[i - 2]) << "retry " << i;
    }
    const std::vector<std::string> logged = CoordinatorLogLines("refused");
    ASSERT_EQ(logged.size(), 1u) << "the same failure is logged once";
    EXPECT_NE(logged.front().find(logged_as), std::string::npos) << logged.front();
  }

  // The coordinator log's lines that contain `text`.
  std::vector<std::string> CoordinatorLogLines(const std::string& text) const {
    std::ifstream in(scratch_.path() + "/coordinator.log");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (line.find(text) != std::string::npos) lines.push_back(line);
    }
    return lines;
  }

  const testing::ScratchDir scratch_{"restore_retry"};
  testing::Processes daemons_;
  std::string coordinator_;
  RefusingShardServer refusing_;
  std::unique_ptr<grpc::Server> refusing_server_;
  std::string refusing_address_;
};

TEST_F(RestoreRetryTest, ARefusedRestoreBacksOffAndANewServerIsTriedAtOnce) {
  testing::ServerProcess kept = StartServer("server-0", "a");
  testing::ServerProcess victim = StartServer("server-1", "b");
  ASSERT_FALSE(kept.address.empty());
  ASSERT_FALSE(victim.address.empty());
  ClientOptions options = testing::SmallFp32Job(coordinator_, "replicated");
  options.job.samples_per_step = 8;
  options.job.replicas = 2;
  options.initial.params = testing::InitialParams(
      FlatLayout::Create(options.job.tensors, options.job.chunk_num_params)->num_params());

  // The refusing server joins after the job's copies are placed on the two
  // real servers; once the victim is lost it is the only server with room.
  testing::ServerKill kill{&victim, &daemons_, kKillDuringStep};
  kill.before = [&] { StartRefusingServer("a"); };
  const testing::KilledRun run =
      testing::TrainThroughAKill(options, kSteps, testing::ParamDependentGradient, kill);
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (size_t rank = 0; rank < run.steps.size(); ++rank) {
    EXPECT_EQ(run.steps[rank].size(), static_cast<size_t>(kSteps)) << "rank " << rank;
    EXPECT_EQ(run.reforms[rank].steps_lost, 0) << "rank " << rank;
  }

  ExpectBackedOff(WatchRefusals(), "replicas not restored yet");

  // A server registers in a zone of its own: it is tried at once, not
  // after the backoff (16 s by now), and takes the missing copies.
  const size_t refused = refusing_.allocations().size();
  const absl::Time registered = absl::Now();
  testing::ServerProcess added = StartServer("server-2", "c");
  ASSERT_FALSE(added.address.empty());
  bool restored = false;
  while (!restored && absl::Now() < registered + absl::Seconds(20)) {
    auto placement = testing::Placement(coordinator_, "replicated");
    restored = placement.ok() && testing::HasCopies(*placement, 2, victim.address);
    if (!restored) absl::SleepFor(absl::Milliseconds(50));
  }
  const double restore_s = absl::ToDoubleSeconds(absl::Now() - registered);
  std::printf("a new server took the missing copies %.2f s after it started\n", restore_s);
  ASSERT_TRUE(restored);
  EXPECT_LT(restore_s, 8.0) << "the new server waited out the backoff";
  EXPECT_EQ(refusing_.allocations().size(), refused);
  auto on_added = testing::ChunksOnServer(added.address, "replicated");
  ASSERT_TRUE(on_added.ok()) << on_added.status();
  EXPECT_GT(*on_added, 0);
}

// A job of one copy per chunk whose server is lost for good resumes from its
// checkpoint on the servers left (MoveJob); the only one with room refuses
// the chunks, and the move backs off the same way.
TEST_F(RestoreRetryTest, ARefusedMoveFromACheckpointBacksOff) {
  testing::ServerProcess victim = StartServer("server-0", "a");
  ASSERT_FALSE(victim.address.empty());
  ClientOptions options = testing::SmallFp32Job(coordinator_, "single");
  options.job.world_size = 1;
  options.job.checkpoint_dir = scratch_.path();
  {
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    const uint64_t n = (*client)->layout().num_params();
    ASSERT_TRUE((*client)->AccumulateGradients(testing::Gradient(n, 0, 1, 0)).ok());
    ASSERT_TRUE((*client)->Step().ok());
  }
  auto [code, output] = testing::RunCommand(absl::StrCat(
      STRATA_BIN_DIR, "/stratactl --coordinator=", coordinator_, " --job=single checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  StartRefusingServer("b");
  ASSERT_FALSE(::testing::Test::HasFailure());
  kill(victim.pid, SIGKILL);
  waitpid(victim.pid, nullptr, 0);
  daemons_.Forget(victim.pid);
  ExpectBackedOff(WatchRefusals(), "cannot resume from a checkpoint yet");
}

}  // namespace
}  // namespace strata
