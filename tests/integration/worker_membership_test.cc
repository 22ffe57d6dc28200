// WorkerMembership against a real coordinator: which newer generations end
// the one a worker runs in, also when they came while it was forming, and
// how a move of the chunks waits for the workers to stop at a step boundary.

#include "client/worker_membership.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "testing/job_runner.h"
#include "testing/job_spec.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

constexpr char kJob[] = "membership";
constexpr absl::Duration kWait = absl::Seconds(30);

// What each on_interrupted call said, in order: the generation it ended and
// whether a member of it was missing.
using Interruption = std::pair<uint64_t, bool>;
class Interruptions {
 public:
  std::function<void(uint64_t, bool)> Callback() {
    return [this](uint64_t running, bool members_changed) {
      absl::MutexLock lock(&mu_);
      seen_.emplace_back(running, members_changed);
    };
  }
  std::vector<Interruption> Seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  // Seen() once it holds `count` calls, or when `timeout` has passed.
  std::vector<Interruption> SeenOnce(size_t count, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Interruption> seen_ ABSL_GUARDED_BY(mu_);
};

// Creates job kJob of `num_params` FP32 parameters in chunks of 256, for
// `world_size` workers, with `replicas` copies of each chunk.
absl::Status CreateJob(v1::Coordinator::Stub* coordinator, uint64_t num_params, uint32_t world_size,
                       uint32_t replicas) {
  v1::CreateJobRequest create;
  *create.mutable_spec() =
      testing::OneTensorSpec(kJob, num_params, 256, v1::DTYPE_FP32, world_size, replicas);
  grpc::ClientContext context;
  v1::JobInfo info;
  return FromGrpcStatus(coordinator->CreateJob(&context, create, &info));
}

class WorkerMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions options;
    options.num_servers = 2;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    coordinator_ = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    ASSERT_TRUE(CreateJob(coordinator_.get(), 1024, /*world_size=*/2, /*replicas=*/1).ok());
  }

  std::unique_ptr<WorkerMembership> Join(const std::string& worker_id,
                                         Interruptions* interruptions) {
    auto membership =
        WorkerMembership::Join(cluster_->coordinator_address(), PlaintextCredentials(), kJob,
                               worker_id, interruptions->Callback());
    EXPECT_TRUE(membership.ok()) << membership.status();
    return membership.ok() ? *std::move(membership) : nullptr;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
};

TEST_F(WorkerMembershipTest, AGenerationThatCameWhileOneFormedEndsIt) {
  Interruptions w0_interruptions, w1_interruptions;
  std::unique_ptr<WorkerMembership> w0 = Join("w0", &w0_interruptions);
  std::unique_ptr<WorkerMembership> w1 = Join("w1", &w1_interruptions);
  ASSERT_TRUE(w0 && w1);
  absl::StatusOr<v1::Generation> both = w0->WaitNewer(0, absl::Now() + kWait);
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->worker_ids_size(), 2);

  // w1 leaves while w0 still forms `both`: w0 observes the generation
  // without w1 before it records that it runs in `both`.
  ASSERT_TRUE(w1->Leave().ok());
  absl::StatusOr<v1::Generation> alone = w0->WaitNewer(both->number(), absl::Now() + kWait);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->worker_ids_size(), 1);
  EXPECT_TRUE(w0_interruptions.Seen().empty()) << "nothing ran yet, nothing to end";

  w0->Running(*both, 0);
  const std::vector<Interruption> ended = {{both->number(), true}};
  EXPECT_EQ(w0_interruptions.Seen(), ended);
  // Recording the same generation again, or the newest, ends nothing more.
  w0->Running(*both, 1);
  w0->Running(*alone, 1);
  EXPECT_EQ(w0_interruptions.Seen(), ended);
}

TEST_F(WorkerMembershipTest, AGenerationThatOnlyAddsAMemberEndsNothing) {
  Interruptions w0_interruptions, w1_interruptions, w2_interruptions;
  std::unique_ptr<WorkerMembership> w0 = Join("w0", &w0_interruptions);
  std::unique_ptr<WorkerMembership> w1 = Join("w1", &w1_interruptions);
  ASSERT_TRUE(w0 && w1);
  absl::StatusOr<v1::Generation> first = w0->WaitNewer(0, absl::Now() + kWait);
  ASSERT_TRUE(first.ok()) << first.status();
  w0->Running(*first, 0);

  std::unique_ptr<WorkerMembership> w2 = Join("w2", &w2_interruptions);
  ASSERT_TRUE(w2);
  absl::StatusOr<v1::Generation> three = w0->WaitNewer(first->number(), absl::Now() + kWait);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->worker_ids_size(), 3);
  EXPECT_EQ(three->placement_version(), first->placement_version());
  // w1 records `first` after it observed `three`: no member of `first` is
  // missing from it.
  w1->Running(*first, 0);
  EXPECT_TRUE(w0_interruptions.Seen().empty());
  EXPECT_TRUE(w1_interruptions.Seen().empty());

  // Then w2 leaves: the generation w0 runs in ends, the moment it is observed.
  w0->Running(*three, 0);
  ASSERT_TRUE(w2->Leave().ok());
  absl::StatusOr<v1::Generation> after = w0->WaitNewer(three->number(), absl::Now() + kWait);
  ASSERT_TRUE(after.ok()) << after.status();
  const std::vector<Interruption> ended = {{three->number(), true}};
  EXPECT_EQ(w0_interruptions.SeenOnce(1, kWait), ended);
}

// Joins w0 and w1 and records that both run in their first generation.
class MoveTest : public WorkerMembershipTest {
 protected:
  void SetUp() override {
    WorkerMembershipTest::SetUp();
    w0_ = Join("w0", &w0_interruptions_);
    w1_ = Join("w1", &w1_interruptions_);
    ASSERT_TRUE(w0_ && w1_);
    absl::StatusOr<v1::Generation> first = w0_->WaitNewer(0, absl::Now() + kWait);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_EQ(first->worker_ids_size(), 2);
    first_ = *first;
    w0_->Running(first_, 0);
    w1_->Running(first_, 0);
  }

  // Drains server 0 on another thread; Join() waits for its answer.
  std::thread Drain(v1::DrainServerResponse* drained) {
    return std::thread([this, drained] {
      v1::DrainServerRequest drain;
      drain.set_address(cluster_->servers()[0]->address());
      grpc::ClientContext context;
      EXPECT_TRUE(FromGrpcStatus(coordinator_->DrainServer(&context, drain, drained)).ok());
    });
  }

  // The generation after `than` that w0 hears of: the same members.
  v1::Generation NextOf(const v1::Generation& than) {
    absl::StatusOr<v1::Generation> next = w0_->WaitNewer(than.number(), absl::Now() + kWait);
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok()) return than;
    EXPECT_TRUE(std::equal(next->worker_ids().begin(), next->worker_ids().end(),
                           than.worker_ids().begin(), than.worker_ids().end()));
    return *next;
  }

  Interruptions w0_interruptions_, w1_interruptions_;
  std::unique_ptr<WorkerMembership> w0_, w1_;
  v1::Generation first_;
};

// A move opens a generation at a step boundary: the steps under way go on
// (nothing is interrupted) and the servers are fenced once both members
// said they stopped for it -- each once its step's pushes and pulls ended.
TEST_F(MoveTest, AMoveWaitsUntilEveryMemberStoppedAtAStepBoundary) {
  w0_->SetStepInFlight(true);
  w1_->SetStepInFlight(true);
  v1::DrainServerResponse drained;
  std::thread drain = Drain(&drained);
  const v1::Generation moved = NextOf(first_);
  EXPECT_TRUE(moved.at_step_boundary());
  EXPECT_GT(moved.placement_version(), first_.placement_version());
  w0_->SetStepInFlight(false);
  // w1's step still runs: the move waits (for at most the 3 s lease).
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(w0_->Latest().number(), moved.number());
  w1_->SetStepInFlight(false);
  const absl::Time stopped = absl::Now();
  drain.join();
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(2)) << "the move went on once both stopped";
  EXPECT_EQ(drained.moved().at_step_boundary(), 1u);
  EXPECT_GT(drained.moved().copies(), 0u);
  EXPECT_GE(drained.moved().boundary_wait_seconds(), 0.5);
  EXPECT_EQ(w0_->Latest().number(), moved.number()) << "no generation cut the step";
  EXPECT_TRUE(w0_interruptions_.Seen().empty());
  EXPECT_TRUE(w1_interruptions_.Seen().empty());
}

// Workers between steps (computing, no pushes in flight) stop for the move
// as soon as they hear of it.
TEST_F(MoveTest, WorkersBetweenStepsStopForAMoveAtOnce) {
  v1::DrainServerResponse drained;
  std::thread drain = Drain(&drained);
  const v1::Generation moved = NextOf(first_);
  EXPECT_TRUE(moved.at_step_boundary());
  drain.join();
  EXPECT_EQ(drained.moved().at_step_boundary(), 1u);
  EXPECT_LT(drained.moved().boundary_wait_seconds(), 1.0);
  EXPECT_TRUE(w0_interruptions_.Seen().empty());
  EXPECT_TRUE(w1_interruptions_.Seen().empty());
}

// A member whose step does not end within the lease: a generation of the
// same placement without the boundary cuts the step (its RPCs cancelled,
// the collective kept: the members are all there).
TEST_F(MoveTest, AMoveWhoseMembersDoNotStopCutsTheStepAfterALease) {
  w1_->SetStepInFlight(true);  // and never ends
  v1::DrainServerResponse drained;
  std::thread drain = Drain(&drained);
  const v1::Generation moved = NextOf(first_);
  EXPECT_TRUE(moved.at_step_boundary());
  const v1::Generation cut = NextOf(moved);
  EXPECT_FALSE(cut.at_step_boundary());
  EXPECT_EQ(cut.placement_version(), moved.placement_version());
  drain.join();
  EXPECT_EQ(drained.moved().at_step_boundary(), 0u);
  EXPECT_GT(drained.moved().copies(), 0u);
  EXPECT_GE(drained.moved().boundary_wait_seconds(), 2.9);
  const std::vector<Interruption> expected = {{first_.number(), false}};
  EXPECT_EQ(w0_interruptions_.SeenOnce(1, kWait), expected);
  EXPECT_EQ(w1_interruptions_.SeenOnce(1, kWait), expected);
}

// A shard server lost while a move waits for a step boundary: the workers'
// steps may need it, so the move waits no more (the coordinator then drops
// the lost server's copies, which waits for the move).
TEST(MoveWithALostServerTest, ALostServerEndsTheWaitForAStepBoundary) {
  LocalClusterOptions options;
  options.num_servers = 3;
  options.worker_lease = absl::Seconds(20);
  options.server_timeout = absl::Milliseconds(500);
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto coordinator = v1::Coordinator::NewStub(MakeChannel((*cluster)->coordinator_address()));
  ASSERT_TRUE(CreateJob(coordinator.get(), 1536, /*world_size=*/1, /*replicas=*/2).ok());
  Interruptions interruptions;
  auto w0 = WorkerMembership::Join((*cluster)->coordinator_address(), PlaintextCredentials(), kJob,
                                   "w0", interruptions.Callback());
  ASSERT_TRUE(w0.ok()) << w0.status();
  absl::StatusOr<v1::Generation> first = (*w0)->WaitNewer(0, absl::Now() + kWait);
  ASSERT_TRUE(first.ok()) << first.status();
  (*w0)->Running(*first, 0);
  (*w0)->SetStepInFlight(true);  // and never ends

  const absl::Time started = absl::Now();
  std::thread drain([&] {
    v1::DrainServerRequest request;
    request.set_address((*cluster)->servers()[0]->address());
    v1::DrainServerResponse response;
    grpc::ClientContext context;
    coordinator->DrainServer(&context, request, &response);
  });
  absl::StatusOr<v1::Generation> moved = (*w0)->WaitNewer(first->number(), absl::Now() + kWait);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_TRUE(moved->at_step_boundary());
  (*cluster)->servers()[2]->Shutdown();
  drain.join();
  EXPECT_LT(absl::Now() - started, absl::Seconds(10)) << "the move waited out the 20 s lease";
}

// A generation of the same members that moved no chunk is one that
// RenewGeneration opened for a group that could not form: the workers
// re-form in it rather than run on in their group (FollowInPlace declines).
TEST_F(WorkerMembershipTest, ARenewedGenerationIsReformedNotFollowed) {
  constexpr int64_t kRenewBefore = 4, kSteps = 8;
  ClientOptions options = testing::SmallFp32Job(cluster_->coordinator_address(), "renewed");
  std::vector<ReformStats> reforms(options.job.world_size);
  std::vector<uint64_t> generations(options.job.world_size);
  testing::RunClients(options, [&](Client& client) {
    const uint64_t first = client.generation();
    for (int64_t s = 1; s <= kSteps; ++s) {
      if (s == kRenewBefore && client.rank() == 0) {
        v1::RenewGenerationRequest renew;
        renew.set_job_id("renewed");
        renew.set_worker_id("worker-0");
        renew.set_generation(first);
        renew.set_reason("a test's renewal");
        v1::RenewGenerationResponse renewed;
        ASSERT_TRUE(CallUnary(coordinator_.get(), &v1::Coordinator::Stub::RenewGeneration, renew,
                              &renewed, absl::Seconds(10))
                        .ok());
        ASSERT_GT(renewed.generation().number(), first);
      }
      ASSERT_TRUE(testing::TrainStep(client).ok());
    }
    reforms[client.rank()] = client.last_reform();
    generations[client.rank()] = client.generation();
  });
  for (size_t rank = 0; rank < reforms.size(); ++rank) {
    EXPECT_EQ(reforms[rank].count, 2) << "rank " << rank;
    EXPECT_EQ(reforms[rank].generation, generations[rank]) << "rank " << rank;
    EXPECT_EQ(reforms[rank].steps_lost, 0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace strata
