// Authentication and authorization over a TLS cluster with an auth file:
// every RPC of both services called as each of eight identities gets what
// the policy says (DESIGN.md, "Security model"), refusals change nothing,
// and a job trains with a user's token exactly as without authentication.
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/shard_transport.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "rpc/auth_policy.h"
#include "rpc/authenticator.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/rendezvous_keys.h"
#include "rpc/token.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"
#include "testing/test_certificates.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 3;
constexpr char kOperatorToken[] = "operator-token-0123456789";
constexpr char kAliceToken[] = "alice-token-0123456789abc";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";

std::vector<float> Gradient(int rank, int64_t step, int micro) {
  return testing::Gradient(FlatLayout::Create(testing::SmallModel(), 256)->num_params(), rank, step,
                           micro);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// The callers of the matrix, in the order of the policy strings below.
enum Caller { kNone, kOtherWorker, kWorker, kOwner, kOtherUser, kServer, kCoord, kOperator };
constexpr char kCallerLetters[] = "nowubscp";
const char* const kCallerNames[] = {"no credentials",  "another job's worker", "the job's worker",
                                    "the owning user", "another user",         "a shard server",
                                    "the coordinator", "an operator"};

// Who may call each RPC on job "a", written out here rather than read from
// the policy table under test: n none, o another job's worker, w the job's
// worker, u its owner, b another user, s a shard server, c the coordinator,
// p an operator.
const std::map<std::string, std::string>& Expected() {
  static const auto* expected = new std::map<std::string, std::string>{
      {"RegisterServer", "s"},
      {"CreateJob", "wup"},
      {"GetJob", "wup"},
      {"ListJobs", "p"},
      {"DeleteJob", "up"},
      {"JoinJob", "wup"},
      {"Heartbeat", "wup"},
      {"LeaveJob", "wup"},
      {"RenewGeneration", "wup"},
      {"WatchGeneration", "wup"},
      {"ListMembers", "wup"},
      {"GetPlacement", "wup"},
      {"SaveCheckpoint", "wup"},
      {"ListCheckpoints", "wup"},
      {"DrainServer", "p"},
      {"RebalanceJob", "up"},
      {"KvSet", "wup"},
      {"KvGet", "wup"},
      {"AllocateChunks", "c"},
      {"DropJob", "c"},
      {"WriteParams", "wc"},
      {"WriteState", "wc"},
      {"Push", "wc"},
      {"CommitStep", "wc"},
      {"Pull", "wc"},
      {"ReadState", "wc"},
      {"ListChunks", "c"},
      {"SaveChunks", "c"},
      {"LoadChunks", "c"},
      {"SeedChunks", "c"},
      {"ReadStepLog", "wc"},
  };
  return *expected;
}

// Whether `method`'s server knows `caller` at all: the coordinator knows
// every credential; a shard server knows certificates and workers' tokens,
// not people's tokens (those live in the coordinator's auth file).
bool KnownTo(const std::string& method, Caller caller) {
  if (caller == kNone) return false;
  const google::protobuf::ServiceDescriptor* shard_server =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::ShardServer::service_full_name());
  const bool on_shard_server = shard_server->FindMethodByName(method) != nullptr;
  return !on_shard_server || (caller != kOwner && caller != kOtherUser && caller != kOperator);
}

template <typename Stub, typename Request, typename Response>
absl::Status CallUnary(Stub* stub,
                       grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                    Response*),
                       const Request& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  Response response;
  return FromGrpcStatus((stub->*method)(&context, request, &response));
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certificates_.Make().ok()) << certificates_.Make();
    const std::string auth_file = scratch_.path() + "/auth";
    WriteFile(auth_file, absl::StrCat("# the test's people\n", "operator ops ", kOperatorToken,
                                      "\n", "user alice ", kAliceToken, "\n", "user bob ",
                                      kBobToken, "  # another user\n"));
    for (const auto& [name, token] :
         {std::pair{"alice", kAliceToken}, std::pair{"bob", kBobToken}}) {
      WriteFile(TokenFile(name), absl::StrCat(token, "\n"));
    }
    LocalClusterOptions options;
    options.coordinator_tls = certificates_.Files("coordinator");
    options.server_tls = certificates_.Files("server");
    options.auth_file = auth_file;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::string TokenFile(const std::string& name) const {
    return absl::StrCat(scratch_.path(), "/", name, ".token");
  }
  TlsFiles CaOnly() const { return TlsFiles{"", "", scratch_.path() + "/ca.pem"}; }

  ClientOptions Job(const std::string& job_id, const std::string& user) const {
    ClientOptions o = testing::SmallFp32Job(cluster_->coordinator_address(), job_id);
    o.initial.params = testing::InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
    o.tls_ca_file = scratch_.path() + "/ca.pem";
    o.token_file = TokenFile(user);
    return o;
  }

  ChannelCredentials CredentialsOf(Caller caller) const {
    absl::StatusOr<ChannelCredentials> made;
    switch (caller) {
      case kNone:
        made = MakeChannelCredentials(CaOnly());
        break;
      case kOtherWorker:
        made = MakeChannelCredentials(CaOnly(), job_b_.worker_token());
        break;
      case kWorker:
        made = MakeChannelCredentials(CaOnly(), job_a_.worker_token());
        break;
      case kOwner:
        made = MakeChannelCredentials(CaOnly(), kAliceToken);
        break;
      case kOtherUser:
        made = MakeChannelCredentials(CaOnly(), kBobToken);
        break;
      case kServer:
        made = MakeChannelCredentials(certificates_.Files("server"));
        break;
      case kCoord:
        made = MakeChannelCredentials(certificates_.Files("coordinator"));
        break;
      case kOperator:
        made = MakeChannelCredentials(CaOnly(), kOperatorToken);
        break;
    }
    EXPECT_TRUE(made.ok()) << made.status();
    return *made;
  }

  v1::JobInfo GetJob(const std::string& job_id, const char* token) const {
    auto stub = v1::Coordinator::NewStub(
        MakeChannel(cluster_->coordinator_address(), *MakeChannelCredentials(CaOnly(), token)));
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::JobInfo job;
    absl::Status s = FromGrpcStatus(stub->GetJob(&context, request, &job));
    EXPECT_TRUE(s.ok()) << s;
    return job;
  }

  // Every RPC, called on job "a" with a request that names it.
  std::map<std::string, std::function<absl::Status(Caller)>> Rpcs() const {
    std::map<std::string, std::function<absl::Status(Caller)>> rpcs;
    auto coordinator = [this](Caller caller) {
      return v1::Coordinator::NewStub(
          MakeChannel(cluster_->coordinator_address(), CredentialsOf(caller)));
    };
    auto shard = [this](Caller caller) {
      return v1::ShardServer::NewStub(
          MakeChannel(job_a_.chunks(0).server_address(), CredentialsOf(caller)));
    };
    using C = v1::Coordinator::Stub;
    using S = v1::ShardServer::Stub;
    rpcs["RegisterServer"] = [=](Caller c) {
      return CallUnary(coordinator(c).get(), &C::RegisterServer, v1::RegisterServerRequest());
    };
    rpcs["CreateJob"] = [=](Caller c) {
      v1::CreateJobRequest r;
      *r.mutable_spec() = job_a_.spec();
      return CallUnary(coordinator(c).get(), &C::CreateJob, r);
    };
    rpcs["GetJob"] = [=](Caller c) {
      v1::GetJobRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::GetJob, r);
    };
    rpcs["ListJobs"] = [=](Caller c) {
      return CallUnary(coordinator(c).get(), &C::ListJobs, v1::ListJobsRequest());
    };
    rpcs["DeleteJob"] = [=](Caller c) {
      v1::DeleteJobRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::DeleteJob, r);
    };
    rpcs["DrainServer"] = [=](Caller c) {
      v1::DrainServerRequest r;
      r.set_address("127.0.0.1:1");  // not registered: NOT_FOUND once admitted
      return CallUnary(coordinator(c).get(), &C::DrainServer, r);
    };
    rpcs["RebalanceJob"] = [=](Caller c) {
      v1::RebalanceJobRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::RebalanceJob, r);
    };
    rpcs["JoinJob"] = [=](Caller c) {
      v1::JoinJobRequest r;
      r.set_job_id("a");  // no worker id: refused by the service once admitted
      return CallUnary(coordinator(c).get(), &C::JoinJob, r);
    };
    rpcs["Heartbeat"] = [=](Caller c) {
      v1::HeartbeatRequest r;
      r.set_job_id("a");
      r.set_worker_id("nobody");
      return CallUnary(coordinator(c).get(), &C::Heartbeat, r);
    };
    rpcs["LeaveJob"] = [=](Caller c) {
      v1::LeaveJobRequest r;
      r.set_job_id("a");
      r.set_worker_id("nobody");
      return CallUnary(coordinator(c).get(), &C::LeaveJob, r);
    };
    rpcs["RenewGeneration"] = [=](Caller c) {
      v1::RenewGenerationRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::RenewGeneration, r);
    };
    rpcs["WatchGeneration"] = [=](Caller c) {
      auto stub = coordinator(c);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
      v1::WatchGenerationRequest r;
      r.set_job_id("a");
      auto reader = stub->WatchGeneration(&context, r);
      v1::Generation generation;
      while (reader->Read(&generation)) {
      }
      return FromGrpcStatus(reader->Finish());
    };
    rpcs["ListMembers"] = [=](Caller c) {
      v1::ListMembersRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::ListMembers, r);
    };
    rpcs["GetPlacement"] = [=](Caller c) {
      v1::GetPlacementRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::GetPlacement, r);
    };
    rpcs["SaveCheckpoint"] = [=](Caller c) {
      v1::SaveCheckpointRequest r;
      r.set_job_id("a");
      r.set_dir("/etc");  // outside the checkpoint root: refused once admitted
      return CallUnary(coordinator(c).get(), &C::SaveCheckpoint, r);
    };
    rpcs["ListCheckpoints"] = [=](Caller c) {
      v1::ListCheckpointsRequest r;
      r.set_job_id("a");
      return CallUnary(coordinator(c).get(), &C::ListCheckpoints, r);
    };
    rpcs["KvSet"] = [=](Caller c) {
      v1::KvSetRequest r;
      r.set_key("job/a/auth-test");
      r.set_value("x");
      return CallUnary(coordinator(c).get(), &C::KvSet, r);
    };
    rpcs["KvGet"] = [=](Caller c) {
      v1::KvGetRequest r;
      r.set_key("job/a/auth-test");
      return CallUnary(coordinator(c).get(), &C::KvGet, r);
    };
    rpcs["AllocateChunks"] = [=](Caller c) {
      v1::AllocateChunksRequest r;
      *r.mutable_spec() = job_a_.spec();  // no chunks
      return CallUnary(shard(c).get(), &S::AllocateChunks, r);
    };
    rpcs["DropJob"] = [=](Caller c) {
      v1::DropJobRequest r;
      r.set_job_id("a");
      return CallUnary(shard(c).get(), &S::DropJob, r);
    };
    rpcs["WriteParams"] = [=](Caller c) {
      v1::WriteParamsRequest r;
      r.set_job_id("a");
      r.add_params(std::numeric_limits<float>::quiet_NaN());  // refused once admitted
      return CallUnary(shard(c).get(), &S::WriteParams, r);
    };
    rpcs["WriteState"] = [=](Caller c) {
      v1::WriteStateRequest r;
      r.set_job_id("a");
      r.set_flat_begin(job_a_.chunks(0).chunk().flat_begin());
      r.add_params(std::numeric_limits<float>::quiet_NaN());
      return CallUnary(shard(c).get(), &S::WriteState, r);
    };
    rpcs["Push"] = [=](Caller c) {
      v1::PushRequest r;
      r.set_job_id("a");
      r.set_step(1000);  // far ahead: refused once admitted
      return CallUnary(shard(c).get(), &S::Push, r);
    };
    rpcs["CommitStep"] = [=](Caller c) {
      v1::CommitStepRequest r;
      r.set_job_id("a");
      r.set_step(1000);  // far ahead: refused once admitted
      return CallUnary(shard(c).get(), &S::CommitStep, r);
    };
    rpcs["Pull"] = [=](Caller c) {
      v1::PullRequest r;
      r.set_job_id("a");
      r.set_step(-1);
      return CallUnary(shard(c).get(), &S::Pull, r);
    };
    rpcs["ReadState"] = [=](Caller c) {
      v1::ReadStateRequest r;
      r.set_job_id("a");
      r.set_flat_begin(job_a_.chunks(0).chunk().flat_begin());
      r.set_num_params(1);
      return CallUnary(shard(c).get(), &S::ReadState, r);
    };
    rpcs["ListChunks"] = [=](Caller c) {
      v1::ListChunksRequest r;
      r.set_job_id("a");
      return CallUnary(shard(c).get(), &S::ListChunks, r);
    };
    rpcs["SaveChunks"] = [=](Caller c) {
      v1::SaveChunksRequest r;
      r.set_job_id("a");
      r.set_dir("/etc");
      return CallUnary(shard(c).get(), &S::SaveChunks, r);
    };
    rpcs["LoadChunks"] = [=](Caller c) {
      v1::LoadChunksRequest r;
      r.set_job_id("a");
      r.set_dir("/etc");
      return CallUnary(shard(c).get(), &S::LoadChunks, r);
    };
    rpcs["SeedChunks"] = [=](Caller c) {
      v1::SeedChunksRequest r;
      r.set_job_id("a");
      r.set_source_address("not an address");
      *r.add_chunks() = job_a_.chunks(0).chunk();
      return CallUnary(shard(c).get(), &S::SeedChunks, r);
    };
    rpcs["ReadStepLog"] = [=](Caller c) {
      v1::ReadStepLogRequest r;
      r.set_job_id("a");
      r.set_flat_begin(job_a_.chunks(0).chunk().flat_begin());
      r.set_num_params(1);
      return CallUnary(shard(c).get(), &S::ReadStepLog, r);
    };
    return rpcs;
  }

  // What must not change when a call is refused: job a's placement and its
  // master state (read with its worker token), bytes.
  std::string Snapshot() const {
    v1::JobInfo job = GetJob("a", kOperatorToken);
    auto layout = FlatLayout::Create(testing::SmallModel(), 256);
    ShardTransport transport("a", &*layout, DType::kFp32, CaOnly());
    EXPECT_TRUE(transport.SetPlacement(job).ok());
    auto state = transport.ReadMasterState(absl::Seconds(10));
    EXPECT_TRUE(state.ok()) << state.status();
    if (!state.ok()) return "";
    std::string bytes = job.SerializeAsString();
    for (const std::vector<float>* v : {&state->params, &state->exp_avg, &state->exp_avg_sq}) {
      bytes.append(reinterpret_cast<const char*>(v->data()), v->size() * sizeof(float));
    }
    return absl::StrCat(bytes, "@", state->step);
  }

  const testing::ScratchDir scratch_{"auth_test"};
  testing::TestCertificates certificates_{scratch_.path()};
  std::unique_ptr<LocalCluster> cluster_;
  v1::JobInfo job_a_;  // alice's
  v1::JobInfo job_b_;  // bob's
};

TEST_F(AuthTest, AUsersJobTrainsAsWithoutAuthentication) {
  const testing::RunResult authed = testing::RunWorkers(Job("a", "alice"), kSteps, 1, Gradient);
  auto plain_cluster = LocalCluster::Start({});
  ASSERT_TRUE(plain_cluster.ok());
  ClientOptions plain = testing::SmallFp32Job((*plain_cluster)->coordinator_address(), "a");
  plain.initial.params = Job("a", "alice").initial.params;
  const testing::RunResult unauthed = testing::RunWorkers(plain, kSteps, 1, Gradient);
  ASSERT_EQ(authed.master.step, kSteps);
  EXPECT_EQ(authed.master.params, unauthed.master.params);
  EXPECT_EQ(authed.master.exp_avg_sq, unauthed.master.exp_avg_sq);
  // The owner is recorded and the workers' token issued; another user's
  // client cannot join the job.
  const v1::JobInfo job = GetJob("a", kAliceToken);
  EXPECT_EQ(job.owner(), "alice");
  EXPECT_TRUE(ValidateToken(job.worker_token(), "worker_token").ok());
  ClientOptions bobs = Job("a", "bob");
  bobs.job.world_size = 2;
  auto refused = Client::Connect(bobs);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("user bob"));
}

// A drained server's chunks are seeded server to server over TLS: the
// target reads the source as a worker of the job, with the token the
// coordinator hands it (a server's own certificate may read no job's
// state). The state arrives bit for bit and the job trains on.
TEST_F(AuthTest, ADrainSeedsCopiesServerToServerWithTheJobsToken) {
  const testing::RunResult trained = testing::RunWorkers(Job("a", "alice"), kSteps, 1, Gradient);
  ASSERT_EQ(trained.master.step, kSteps);
  const std::string drained = GetJob("a", kAliceToken).chunks(0).server_address();
  auto stub = v1::Coordinator::NewStub(MakeChannel(
      cluster_->coordinator_address(), *MakeChannelCredentials(CaOnly(), kOperatorToken)));
  v1::DrainServerRequest request;
  request.set_address(drained);
  v1::DrainServerResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  const absl::Status s = FromGrpcStatus(stub->DrainServer(&context, request, &response));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GT(response.moved().copies(), 0u);
  EXPECT_GT(response.moved().bytes(), 0u);
  const v1::JobInfo moved = GetJob("a", kAliceToken);
  for (const auto& c : moved.chunks()) {
    EXPECT_NE(c.server_address(), drained) << "chunk " << c.chunk().chunk_id();
  }
  // The job is elastic (a worker that connects first may train alone): the
  // state is read before any worker trains.
  testing::RunClients(Job("a", "alice"), [&](Client& client) {
    auto state = client.ReadMasterState();
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->step, kSteps);
    EXPECT_TRUE(state->params == trained.master.params &&
                state->exp_avg == trained.master.exp_avg &&
                state->exp_avg_sq == trained.master.exp_avg_sq)
        << "the drained chunks' state changed on its way";
  });
  testing::RunClients(Job("a", "alice"),
                      [&](Client& client) { EXPECT_TRUE(testing::TrainStep(client).ok()); });
}

// A shard server registers only an address its certificate names (the
// test certificates name 127.0.0.1 and localhost): the coordinator, which
// dials it, is never pointed at another host by a server certificate.
TEST_F(AuthTest, AServerRegistersOnlyAnAddressItsCertificateNames) {
  using C = v1::Coordinator::Stub;
  auto as_server = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), CredentialsOf(kServer)));
  auto as_operator = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), CredentialsOf(kOperator)));
  auto registered = [&](const std::string& address) {
    v1::DrainServerRequest request;
    request.set_address(address);
    request.set_cancel(true);
    return CallUnary(as_operator.get(), &C::DrainServer, request).code() !=
           absl::StatusCode::kNotFound;
  };
  auto register_as = [&](const std::string& address) {
    v1::RegisterServerRequest request;
    request.mutable_server()->set_address(address);
    request.mutable_server()->set_host_budget_bytes(64 << 20);
    return CallUnary(as_server.get(), &C::RegisterServer, request);
  };
  for (const std::string address : {"10.9.8.7:7701", "evil.example:7701", "[::1]:7701"}) {
    const absl::Status s = register_as(address);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << address << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("server.address")) << s;
    EXPECT_FALSE(registered(address)) << address;
  }
  for (const std::string address : {"127.0.0.1:1", "LOCALHOST:2"}) {
    const absl::Status s = register_as(address);
    EXPECT_TRUE(s.ok()) << address << ": " << s;
    EXPECT_TRUE(registered(address)) << address;
  }
}

TEST_F(AuthTest, EveryRpcAsEveryCallerGetsWhatThePolicySays) {
  testing::RunWorkers(Job("a", "alice"), kSteps, 1, Gradient);
  testing::RunWorkers(Job("b", "bob"), 1, 1, Gradient);
  job_a_ = GetJob("a", kAliceToken);
  job_b_ = GetJob("b", kBobToken);
  const auto rpcs = Rpcs();
  // The table under test covers exactly the RPCs this test calls.
  ASSERT_EQ(AuthPolicyTable().size(), Expected().size());
  for (const MethodPolicy& p : AuthPolicyTable()) {
    ASSERT_TRUE(Expected().count(std::string(p.method))) << p.method;
  }

  // Refusals first: each with its code, and nothing changes.
  const std::string before = Snapshot();
  ASSERT_FALSE(before.empty());
  for (const auto& [method, allowed] : Expected()) {
    for (int caller = kNone; caller <= kOperator; ++caller) {
      if (allowed.find(kCallerLetters[caller]) != std::string::npos) continue;
      absl::Status s = rpcs.at(method)(static_cast<Caller>(caller));
      const absl::StatusCode want = KnownTo(method, static_cast<Caller>(caller))
                                        ? absl::StatusCode::kPermissionDenied
                                        : absl::StatusCode::kUnauthenticated;
      EXPECT_EQ(s.code(), want) << method << " as " << kCallerNames[caller] << ": " << s;
    }
  }
  EXPECT_EQ(Snapshot(), before) << "a refused call changed job a";

  // Then the callers the policy admits: past the gate (the service may still
  // refuse the request itself). DropJob and DeleteJob end the job: last.
  std::vector<std::string> order;
  for (const auto& [method, allowed] : Expected()) {
    if (method != "DropJob" && method != "DeleteJob") order.push_back(method);
  }
  order.push_back("DropJob");
  order.push_back("DeleteJob");
  for (const std::string& method : order) {
    for (int caller = kNone; caller <= kOperator; ++caller) {
      if (Expected().at(method).find(kCallerLetters[caller]) == std::string::npos) continue;
      absl::Status s = rpcs.at(method)(static_cast<Caller>(caller));
      EXPECT_NE(s.code(), absl::StatusCode::kUnauthenticated)
          << method << " as " << kCallerNames[caller] << ": " << s;
      EXPECT_NE(s.code(), absl::StatusCode::kPermissionDenied)
          << method << " as " << kCallerNames[caller] << ": " << s;
    }
  }
}

TEST_F(AuthTest, UnknownAndMalformedTokensAreUnauthenticated) {
  auto list = [&](const ChannelCredentials& credentials) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), credentials));
    return CallUnary(stub.get(), &v1::Coordinator::Stub::ListJobs, v1::ListJobsRequest());
  };
  absl::Status s = list(*MakeChannelCredentials(CaOnly(), "a-token-no-one-was-given"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_THAT(s.message(), HasSubstr("not known"));
  EXPECT_EQ(list(*MakeChannelCredentials(CaOnly(), kOperatorToken)).code(), absl::StatusCode::kOk);
  // A job's worker token ends with the job.
  ClientOptions gone = Job("gone", "alice");
  gone.job.world_size = 1;  // a lone worker: no peer's leaving interrupts its step
  testing::RunClients(gone, [](Client& client) {
    ASSERT_TRUE(testing::TrainStep(client).ok());
    ASSERT_TRUE(client.Leave().ok());
  });
  const std::string token = GetJob("gone", kAliceToken).worker_token();
  auto stub = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), *MakeChannelCredentials(CaOnly(), kAliceToken)));
  v1::DeleteJobRequest del;
  del.set_job_id("gone");
  const absl::Status deleted = CallUnary(stub.get(), &v1::Coordinator::Stub::DeleteJob, del);
  ASSERT_TRUE(deleted.ok()) << deleted;
  stub = v1::Coordinator::NewStub(
      MakeChannel(cluster_->coordinator_address(), *MakeChannelCredentials(CaOnly(), token)));
  v1::GetJobRequest get;
  get.set_job_id("gone");
  EXPECT_EQ(CallUnary(stub.get(), &v1::Coordinator::Stub::GetJob, get).code(),
            absl::StatusCode::kUnauthenticated);
  // Tokens go over TLS only.
  EXPECT_EQ(MakeChannelCredentials(TlsFiles{}, kAliceToken).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// stratactl takes the coordinator and credentials from the environment
// (the names strata.launch gives workers); its flags override them.
TEST_F(AuthTest, StratactlTakesAddressAndCredentialsFromTheEnvironment) {
  WriteFile(TokenFile("ops"), absl::StrCat(kOperatorToken, "\n"));
  auto stratactl = [&](const std::string& environment, const std::string& args) {
    return testing::RunCommand(
        absl::StrCat("env ", environment, " ", STRATA_BIN_DIR, "/stratactl --json ", args));
  };
  const std::string coordinator = "STRATA_COORDINATOR=" + cluster_->coordinator_address();
  const std::string ca = absl::StrCat("STRATA_TLS_CA=", scratch_.path(), "/ca.pem");
  auto [code, output] = stratactl(
      absl::StrCat(coordinator, " ", ca, " STRATA_TOKEN_FILE=", TokenFile("ops")), "jobs");
  EXPECT_EQ(code, 0) << output;
  EXPECT_TRUE(absl::StartsWith(output, "[")) << output;
  // A user may not list jobs: the environment's token was the one sent.
  auto [user_code, user_output] = stratactl(
      absl::StrCat(coordinator, " ", ca, " STRATA_TOKEN_FILE=", TokenFile("alice")), "jobs");
  EXPECT_EQ(user_code, 1) << user_output;
  EXPECT_THAT(user_output, HasSubstr("PERMISSION_DENIED"));
  // Flags win over the environment.
  auto [flag_code, flag_output] =
      stratactl(absl::StrCat("STRATA_COORDINATOR=127.0.0.1:1 ", ca,
                             " STRATA_TOKEN_FILE=", TokenFile("alice")),
                absl::StrCat("--coordinator=", cluster_->coordinator_address(),
                             " --token_file=", TokenFile("ops"), " jobs"));
  EXPECT_EQ(flag_code, 0) << flag_output;
  // Without the environment's CA the token is not sent at all.
  auto [no_tls_code, no_tls_output] =
      stratactl(absl::StrCat(coordinator, " STRATA_TOKEN_FILE=", TokenFile("ops")), "jobs");
  EXPECT_EQ(no_tls_code, 2) << no_tls_output;
  EXPECT_THAT(no_tls_output, HasSubstr("tls_ca"));
}

TEST(JobOfRendezvousKeyTest, OnlyKeysUnderAJobsPrefixBelongToIt) {
  EXPECT_EQ(JobOfRendezvousKey(GenerationRendezvousPrefix("a", 7) + "0"), "a");
  EXPECT_EQ(JobOfRendezvousKey("job/a/x"), "a");
  for (const char* outside : {"", "job/", "job//x", "job/a", "jobs/a/x", "a/x", "/job/a/x"}) {
    EXPECT_EQ(JobOfRendezvousKey(outside), "") << outside;
  }
}

TEST(AuthFileTest, BadLinesAreNamedAndTokensNeverQuoted) {
  const testing::ScratchDir scratch("auth_file_test");
  const std::string path = scratch.path() + "/auth";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"admin root 0123456789abcdefXYZ\n", "line 1"},
      {"user alice short\n", "line 1"},
      {"# ok\nuser alice 0123456789abcdefXYZ\nuser alice 0123456789abcdefXYW\n", "line 3"},
      {"user alice 0123456789abcdefXYZ\nuser bob 0123456789abcdefXYZ\n", "line 2"},
      {"user alice 0123456789abcdefXYZ extra\n", "line 1"},
  };
  for (const auto& [text, where] : cases) {
    WriteFile(path, text);
    auto auth = Authenticator::Create(path, nullptr);
    ASSERT_FALSE(auth.ok()) << text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(auth.status().message(), HasSubstr(where)) << text;
    EXPECT_THAT(auth.status().message(), ::testing::Not(HasSubstr("0123456789abcdef"))) << text;
  }
  WriteFile(path, "operator ops 0123456789abcdefXYZ\n\nuser a 0123456789abcdefXYW # c\n");
  auto auth = Authenticator::Create(path, nullptr);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->num_operators(), 1);
  EXPECT_EQ((*auth)->num_users(), 1);
}

TEST(AuthStartUpTest, AuthenticationWithoutTlsDoesNotStart) {
  const testing::ScratchDir scratch("auth_start_up_test");
  WriteFile(scratch.path() + "/auth", "operator ops 0123456789abcdefXYZ\n");
  LocalClusterOptions options;
  options.auth_file = scratch.path() + "/auth";
  auto cluster = LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster.status().message(), HasSubstr("needs TLS"));
}

}  // namespace
}  // namespace strata
