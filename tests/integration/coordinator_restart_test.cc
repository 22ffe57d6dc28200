// The coordinator's state lives in RocksDB: after a restart on the same data
// directory it has the same servers, jobs, members and rendezvous keys.
#include <filesystem>
#include <functional>
#include <memory>

#include "coordinator/coordinator_server.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "rpc/rendezvous_keys.h"
#include "shard/shard_server.h"
#include "storage/metadata_store.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

template <typename Request, typename Response, typename Method>
grpc::Status Call(v1::Coordinator::Stub* stub, Method method, const Request& request,
                  Response* response) {
  grpc::ClientContext context;
  return (stub->*method)(&context, request, response);
}

// One step of `client` with zero gradients.
absl::Status ZeroStep(Client& client) {
  std::vector<float> grads(client.layout().num_params(), 0.0f);
  RETURN_IF_ERROR(client.AccumulateGradients(grads));
  return client.Step().status();
}

// A coordinator and one shard server in a scratch directory; Restart()
// starts the coordinator again on the same data directory.
class CoordinatorRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator_options_.data_dir = scratch_.path() + "/coordinator";
    auto coordinator = Coordinator::Start(coordinator_options_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    ShardServerOptions server_options;
    server_options.coordinator_address = coordinator_->address();
    server_options.data_dir = scratch_.path() + "/server";
    auto server = ShardServer::Start(server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Stops the coordinator, runs `between` (its store closed), starts it again.
  void Restart(const std::function<void()>& between = [] {}) {
    coordinator_->Shutdown();
    coordinator_.reset();
    between();
    auto coordinator = Coordinator::Start(coordinator_options_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  // Worker `worker_id` of a one-worker job `job_id` on this coordinator.
  ClientOptions Job(const std::string& job_id, const std::string& worker_id) const {
    ClientOptions options;
    options.coordinator_address = coordinator_->address();
    options.job_id = job_id;
    options.worker_id = worker_id;
    options.job.tensors = {{"w", {300}}};
    options.job.chunk_num_params = 128;
    options.rendezvous_timeout = absl::Seconds(20);
    return options;
  }

  const testing::ScratchDir scratch_{"coordinator_restart_test"};
  CoordinatorOptions coordinator_options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ShardServer> server_;
};

TEST_F(CoordinatorRestartTest, StateSurvivesARestart) {
  auto client = Client::Connect(Job("restart", "w0"));
  ASSERT_TRUE(client.ok()) << client.status();

  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator_->address()));
  v1::KvSetRequest set;
  set.set_key(RendezvousPrefix("restart") + "some/key");
  set.set_value("value");
  v1::KvSetResponse set_response;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::KvSet, set, &set_response).ok());
  v1::GetJobRequest get;
  get.set_job_id("restart");
  v1::JobInfo before;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::GetJob, get, &before).ok());

  Restart();
  stub = v1::Coordinator::NewStub(MakeChannel(coordinator_->address()));

  v1::JobInfo after;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::GetJob, get, &after).ok());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
  EXPECT_EQ(after.chunks_size(), 3);
  v1::ListMembersRequest list;
  list.set_job_id("restart");
  v1::ListMembersResponse members;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::ListMembers, list, &members).ok());
  ASSERT_EQ(members.members_size(), 1);
  EXPECT_EQ(members.members(0).worker_id(), "w0");
  v1::KvGetRequest kv;
  kv.set_key(RendezvousPrefix("restart") + "some/key");
  v1::KvGetResponse value;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::KvGet, kv, &value).ok());
  EXPECT_EQ(value.value(), "value");
  // The same spec again returns the existing job; another spec is refused.
  v1::CreateJobRequest create;
  *create.mutable_spec() = before.spec();
  v1::JobInfo again;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::CreateJob, create, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), before.SerializeAsString());
  create.mutable_spec()->set_world_size(2);
  EXPECT_EQ(Call(stub.get(), &v1::Coordinator::Stub::CreateJob, create, &again).error_code(),
            grpc::FAILED_PRECONDITION);
}

// A move the coordinator announced (a generation with a new placement
// version) but had not recorded when it stopped: after the restart the
// copies stay where they were, recorded under that version, and workers --
// who wait for it -- train on.
TEST_F(CoordinatorRestartTest, AMoveCutByARestartLeavesTheCopiesWhereTheyWere) {
  {
    auto client = Client::Connect(Job("cut", "w0"));
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE(ZeroStep(**client).ok());
    ASSERT_TRUE((*client)->Leave().ok());
  }
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator_->address()));
  v1::GetJobRequest get;
  get.set_job_id("cut");
  v1::JobInfo before;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::GetJob, get, &before).ok());

  // What a move leaves in the coordinator's store once it opened its
  // generation: the generation after the current one, with the next
  // placement version.
  Restart([&] {
    auto metadata = MetadataStore::OpenInDataDir(coordinator_options_.data_dir);
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    auto stored = (*metadata)->Get("generation/cut");
    ASSERT_TRUE(stored.ok() && stored->has_value());
    v1::Generation generation;
    ASSERT_TRUE(generation.ParseFromString(**stored));
    generation.set_number(generation.number() + 1);
    generation.set_placement_version(before.placement_version() + 1);
    ASSERT_TRUE((*metadata)->Put("generation/cut", generation.SerializeAsString()).ok());
  });
  stub = v1::Coordinator::NewStub(MakeChannel(coordinator_->address()));
  v1::JobInfo after;
  ASSERT_TRUE(Call(stub.get(), &v1::Coordinator::Stub::GetJob, get, &after).ok());
  EXPECT_EQ(after.placement_version(), before.placement_version() + 1);
  v1::JobInfo same = after;
  same.set_placement_version(before.placement_version());
  EXPECT_EQ(same.SerializeAsString(), before.SerializeAsString()) << "the copies moved";

  auto client = Client::Connect(Job("cut", "w1"));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->step(), 1);
  ASSERT_TRUE(ZeroStep(**client).ok());
  EXPECT_EQ((*client)->step(), 2);
}

}  // namespace
}  // namespace strata
