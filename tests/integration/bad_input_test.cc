// Bad input against real servers on loopback: each request gets the status
// code of DESIGN.md and a message naming the problem; afterwards placement
// and master state are exactly as before and the job still trains.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/step_wire.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/job_spec.h"
#include "testing/local_cluster.h"
#include "testing/placement.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = LocalCluster::Start({2, uint64_t{1} << 20, 1});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ClientOptions o;
    o.coordinator_address = cluster_->coordinator_address();
    o.job_id = "bad-input";
    o.worker_id = "only";
    o.job.tensors = testing::SmallModel();
    o.job.world_size = 1;
    o.job.chunk_num_params = 256;
    o.initial.params = testing::InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
    auto client = Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    for (int s = 1; s <= 2; ++s) Step();
    coordinator_ = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    v1::GetJobRequest get;
    get.set_job_id("bad-input");
    grpc::ClientContext context;
    ASSERT_TRUE(coordinator_->GetJob(&context, get, &job_).ok());
    chunk0_server_ = job_.chunks(0).server_address();
    // A channel that sends more than the servers accept.
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    shard_ = v1::ShardServer::NewStub(
        grpc::CreateCustomChannel(chunk0_server_, grpc::InsecureChannelCredentials(), args));
    before_placement_ = Placement();
    before_state_ = *client_->ReadMasterState();
  }

  void Step() {
    absl::Status step = testing::TrainStep(*client_);
    ASSERT_TRUE(step.ok()) << step;
  }

  std::string Placement() {
    auto response = testing::Placement(cluster_->coordinator_address(), "bad-input");
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->SerializeAsString() : "";
  }

  // A valid push of chunk 0 for the next step, to be broken by each test.
  v1::PushRequest GoodPush() {
    v1::PushRequest push;
    push.set_job_id("bad-input");
    push.set_step(client_->step() + 1);
    push.set_flat_begin(0);
    push.set_num_params(64);
    push.set_dtype(v1::DTYPE_FP16);
    push.set_coef(1.0f);
    push.set_grads(std::string(128, '\0'));
    return push;
  }

  absl::Status Push(const v1::PushRequest& push) {
    grpc::ClientContext context;
    v1::PushResponse response;
    return FromGrpcStatus(shard_->Push(&context, push, &response));
  }

  void TearDown() override {
    if (HasFailure() || client_ == nullptr) return;
    // Nothing changed, nothing crashed, and the job still trains.
    EXPECT_EQ(Placement(), before_placement_);
    MasterState after = *client_->ReadMasterState();
    EXPECT_EQ(after.step, before_state_.step);
    EXPECT_EQ(after.params, before_state_.params);
    EXPECT_EQ(after.exp_avg_sq, before_state_.exp_avg_sq);
    Step();
    EXPECT_EQ(client_->ReadMasterState()->step, before_state_.step + 1);
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<v1::ShardServer::Stub> shard_;
  v1::JobInfo job_;
  std::string chunk0_server_;
  std::string before_placement_;
  MasterState before_state_;
};

TEST_F(BadInputTest, WrongLength) {
  v1::PushRequest push = GoodPush();
  push.set_grads(std::string(100, '\0'));
  absl::Status s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("grads has 100 bytes"));
}

TEST_F(BadInputTest, UnknownJobAndChunk) {
  v1::PushRequest push = GoodPush();
  push.set_job_id("no-such-job");
  absl::Status s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no-such-job"));
  push = GoodPush();
  push.set_flat_begin(1u << 30);
  s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no chunk"));
  push = GoodPush();
  push.set_flat_begin(200);
  push.set_num_params(100);  // crosses the end of chunk 0 at 256
  push.set_grads(std::string(200, '\0'));
  s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("crosses the end of chunk 0"));
}

TEST_F(BadInputTest, NonFiniteCoefAndWrongDtype) {
  for (float coef : {NAN, INFINITY, -INFINITY}) {
    v1::PushRequest push = GoodPush();
    push.set_coef(coef);
    absl::Status s = Push(push);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("not finite"));
  }
  v1::PushRequest push = GoodPush();
  push.set_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(Push(push).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, BadCommits) {
  auto commit = [&](auto change) {
    v1::CommitStepRequest request;
    request.set_job_id("bad-input");
    request.set_step(client_->step() + 1);
    request.set_generation(client_->generation());
    request.set_coef(1.0f);
    change(request);
    grpc::ClientContext context;
    v1::CommitStepResponse response;
    return FromGrpcStatus(shard_->CommitStep(&context, request, &response));
  };
  for (float coef : {NAN, INFINITY}) {
    absl::Status s = commit([&](v1::CommitStepRequest& r) { r.set_coef(coef); });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("coef"));
  }
  absl::Status s = commit([](v1::CommitStepRequest& r) { r.set_lr(-1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lr -1"));
  s = commit([](v1::CommitStepRequest& r) { r.set_step(0); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("step 0"));
  s = commit([](v1::CommitStepRequest& r) { r.set_job_id("no-such-job"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no-such-job"));
  s = commit([&](v1::CommitStepRequest& r) { r.set_step(client_->step() + 2); });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("future"));
}

TEST_F(BadInputTest, PastAndFutureSteps) {
  v1::PushRequest push = GoodPush();
  push.set_step(client_->step() - 1);
  absl::Status s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("old"));
  push.set_step(client_->step() + 2);
  s = Push(push);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("future"));
  // A retried push of the applied step returns the stored result.
  push.set_step(client_->step());
  push.set_grads(std::string(128, '\x7f'));
  EXPECT_TRUE(Push(push).ok());
}

TEST_F(BadInputTest, OversizedMessage) {
  v1::PushRequest push = GoodPush();
  push.set_grads(std::string(kMaxMessageBytes + 1024, '\0'));
  EXPECT_EQ(Push(push).code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(BadInputTest, JobThatDoesNotFitTheBudget) {
  v1::CreateJobRequest create;
  // 1 Mi params need 16 MiB; the budget is 2 x 1 MiB.
  *create.mutable_spec() = testing::OneTensorSpec("too-big", 1 << 20, 1 << 16, v1::DTYPE_FP16);
  v1::JobSpec* spec = create.mutable_spec();
  v1::JobInfo info;
  grpc::ClientContext context;
  absl::Status s = FromGrpcStatus(coordinator_->CreateJob(&context, create, &info));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("does not fit"));
  v1::GetJobRequest get;
  get.set_job_id("too-big");
  grpc::ClientContext get_context;
  EXPECT_EQ(coordinator_->GetJob(&get_context, get, &info).error_code(), grpc::NOT_FOUND);
  // A malformed spec is refused before anything is planned.
  spec->set_chunk_num_params(100);
  grpc::ClientContext bad_context;
  s = FromGrpcStatus(coordinator_->CreateJob(&bad_context, create, &info));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("chunk_num_params"));
}

TEST_F(BadInputTest, GarbageBytesOnThePort) {
  std::vector<std::string> host_port = absl::StrSplit(chunk0_server_, ':');
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port[1])));
    inet_pton(AF_INET, host_port[0].c_str(), &addr.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string garbage = "GET / HTTP/1.1\r\n\r\n\x00\xff\x13garbage";
    garbage += std::string(4096, '\xab');
    ASSERT_GT(write(fd, garbage.data(), garbage.size()), 0);
    char buffer[256];
    (void)read(fd, buffer, sizeof(buffer));  // the server answers or closes
    close(fd);
  }
}

// Push, Pull and ReadState take raw buffers (rpc/step_wire.h): bytes that
// are no request of theirs are INVALID_ARGUMENT, said so, and change
// nothing (TearDown).
TEST_F(BadInputTest, RawRequestsThatDoNotParseAreRefused) {
  grpc::GenericStub generic(MakeChannel(chunk0_server_));
  grpc::Slice garbage(std::string("\x0a\xff\xff\xff\xff\x0f truncated"));
  const grpc::ByteBuffer request(&garbage, 1);
  const std::pair<const char*, const char*> rpcs[] = {
      {kPushMethod, "the push request does not parse"},
      {kPullMethod, "the pull request does not parse"},
      {kReadStateMethod, "the state read request does not parse"}};
  for (const auto& [method, message] : rpcs) {
    grpc::ByteBuffer response;
    const absl::Status s = CallRawUnary(&generic, method, request, &response, absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << method << ": " << s;
    EXPECT_EQ(s.message(), message);
  }
}

TEST_F(BadInputTest, WriteStateRefusesBadStateAndStartedJobs) {
  auto write = [&](int n, float p, float v, int64_t step, int m_count) {
    v1::WriteStateRequest request;
    request.set_job_id("bad-input");
    request.set_flat_begin(0);
    request.set_step(step);
    for (int i = 0; i < n; ++i) request.add_params(p);
    for (int i = 0; i < m_count; ++i) request.add_exp_avg(0.0f);
    for (int i = 0; i < n; ++i) request.add_exp_avg_sq(v);
    grpc::ClientContext context;
    v1::WriteStateResponse response;
    return FromGrpcStatus(shard_->WriteState(&context, request, &response));
  };
  absl::Status s = write(8, 1.0f, 1.0f, 2, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("as many"));
  EXPECT_EQ(write(8, NAN, 1.0f, 2, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(write(8, 1.0f, -1.0f, 2, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(write(8, 1.0f, 1.0f, -1, 8).code(), absl::StatusCode::kInvalidArgument);
  // Valid state, but the job has run steps: refused, nothing changes.
  s = write(8, 1.0f, 1.0f, 2, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("before the first push"));

  // The stored form: the chunk's own bytes (read back with `stored`) are
  // valid but come too late; sizes, values and mixtures are named.
  auto stored = testing::ReadCopy(chunk0_server_, "bad-input", 0, 8, /*stored=*/true);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored_state().size(), 8 * 12u);
  EXPECT_EQ(stored->params_size(), 0);
  auto write_stored = [&](uint64_t n, std::string bytes, int params = 0) {
    v1::WriteStateRequest request;
    request.set_job_id("bad-input");
    request.set_flat_begin(0);
    request.set_step(2);
    request.set_num_params(n);
    request.set_stored_state(std::move(bytes));
    for (int i = 0; i < params; ++i) request.add_params(1.0f);
    grpc::ClientContext context;
    v1::WriteStateResponse response;
    return FromGrpcStatus(shard_->WriteState(&context, request, &response));
  };
  const std::string good = stored->stored_state();
  struct Case {
    absl::Status status;
    std::string names;
  };
  std::string nan_p = good, negative_v = good;
  const float nan = NAN, minus = -1.0f;
  std::memcpy(nan_p.data() + 4, &nan, 4);
  std::memcpy(negative_v.data() + 16 * 4 + 8, &minus, 4);
  for (const Case& c : std::vector<Case>{
           {write_stored(8, good, 8), "in place of params"},
           {write_stored(8, good.substr(4)), "stored_state: 92 bytes"},
           {write_stored(uint64_t{1} << 62, good), "crosses the end"},
           {write_stored(8, nan_p), "stored_state: params[1] is not finite"},
           {write_stored(8, negative_v), "stored_state: exp_avg_sq[2] is negative"},
       }) {
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
    EXPECT_THAT(c.status.message(), HasSubstr(c.names));
  }
  s = write_stored(8, good);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("before the first push"));
}

// SeedChunks: malformed sources, tokens and chunk lists are refused naming
// the field; a source that cannot be read fails naming it; a chunk that
// has stepped is not overwritten (TearDown checks the state).
TEST_F(BadInputTest, SeedRequestsNameTheProblem) {
  const v1::ChunkSpec chunk = job_.chunks(0).chunk();
  v1::ChunkSpec shorter = chunk;
  shorter.set_num_params(chunk.num_params() - 1);
  v1::ChunkSpec renamed = chunk;
  renamed.set_chunk_id(chunk.chunk_id() + 1000);
  struct Case {
    std::function<void(v1::SeedChunksRequest*)> change;
    absl::StatusCode code;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->set_source_address("no-port"); }, absl::StatusCode::kInvalidArgument,
       "source_address"},
      {[](auto* r) { r->set_source_address(std::string(100000, 'h') + ":1"); },
       absl::StatusCode::kInvalidArgument, "source_address"},
      {[](auto* r) { r->set_worker_token("short"); }, absl::StatusCode::kInvalidArgument,
       "worker_token"},
      {[](auto* r) { r->clear_chunks(); }, absl::StatusCode::kInvalidArgument, "chunks: 0 named"},
      {[&](auto* r) { *r->mutable_chunks(0) = shorter; }, absl::StatusCode::kInvalidArgument,
       "not a chunk as allocated"},
      {[&](auto* r) { *r->mutable_chunks(0) = renamed; }, absl::StatusCode::kInvalidArgument,
       "not a chunk as allocated"},
      {[&](auto* r) { *r->add_chunks() = chunk; }, absl::StatusCode::kInvalidArgument,
       "named twice"},
      {[](auto* r) { r->set_job_id("nope"); }, absl::StatusCode::kNotFound, "unknown job 'nope'"},
      {[](auto* r) { r->set_source_address("127.0.0.1:1"); }, absl::StatusCode::kUnavailable,
       "source shard server 127.0.0.1:1"},
      // Its own copy, read back: the chunk has stepped, so it takes no state.
      {[](auto*) {}, absl::StatusCode::kFailedPrecondition, ""},
  };
  for (const Case& c : cases) {
    v1::SeedChunksRequest request;
    request.set_job_id("bad-input");
    request.set_source_address(chunk0_server_);
    *request.add_chunks() = chunk;
    c.change(&request);
    grpc::ClientContext context;
    v1::SeedChunksResponse response;
    absl::Status s = FromGrpcStatus(shard_->SeedChunks(&context, request, &response));
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.names));
    EXPECT_LT(s.message().size(), 400u) << "the value is echoed whole";
  }
}

// A copy move's allocation names chunks the server holds already: a server
// that lacks one (it restarted without it) refuses by name and makes
// nothing -- neither the chunk nor, for a job it does not have, the job --
// instead of a chunk at step 0 that the job's workers would meet.
TEST_F(BadInputTest, AnAllocationOfChunksTheServerLacksIsRefused) {
  auto held_before = testing::ChunksOnServer(chunk0_server_, "bad-input");
  ASSERT_TRUE(held_before.ok()) << held_before.status();
  v1::AllocateChunksRequest allocate;
  *allocate.mutable_spec() = job_.spec();
  for (const v1::ChunkAssignment& a : job_.chunks()) *allocate.add_chunks() = a.chunk();
  ASSERT_GT(allocate.chunks_size(), *held_before) << "every chunk on one server";
  allocate.set_chunks_held(true);
  v1::AllocateChunksRequest absent_job = allocate;
  absent_job.mutable_spec()->set_job_id("restarted");
  for (const v1::AllocateChunksRequest& request : {allocate, absent_job}) {
    grpc::ClientContext context;
    v1::AllocateChunksResponse response;
    absl::Status s = FromGrpcStatus(shard_->AllocateChunks(&context, request, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("chunks_held: chunk "));
    EXPECT_THAT(s.message(), HasSubstr("is not on this shard server"));
  }
  auto held = testing::ChunksOnServer(chunk0_server_, "bad-input");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*held, *held_before);
  auto restarted = testing::ChunksOnServer(chunk0_server_, "restarted");
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(*restarted, 0);
}

// Building copies aside (SeedChunks with prepare) names the field at fault;
// a source that cannot be read leaves nothing built (the fenced seed then
// copies whole). A step log is read only once started, within its bounds. A
// good prepare builds the copy with its copy of the step before.
TEST_F(BadInputTest, PrepareAndStepLogRequestsNameTheProblem) {
  const v1::ChunkSpec chunk = job_.chunks(0).chunk();
  v1::ChunkSpec renamed = chunk;
  renamed.set_chunk_id(chunk.chunk_id() + 1000);
  struct Case {
    std::function<void(v1::SeedChunksRequest*)> change;
    std::string names;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->mutable_spec()->set_job_id("other"); }, "spec.job_id"},
      {[](auto* r) { r->mutable_spec()->set_world_size(0); }, "spec: world size"},
      {[&](auto* r) { *r->mutable_chunks(0) = renamed; }, "not a chunk of the job's spec"},
      {[&](auto* r) { *r->add_chunks() = chunk; }, "named twice"},
      {[](auto* r) { r->clear_chunks(); }, "chunks: 0 named"},
      {[](auto* r) { r->set_source_address("no-port"); }, "source_address"},
  };
  auto prepare = [&](const std::function<void(v1::SeedChunksRequest*)>& change,
                     v1::SeedChunksResponse* response) {
    v1::SeedChunksRequest request;
    request.set_job_id("bad-input");
    request.set_source_address(chunk0_server_);
    request.set_prepare(true);
    *request.mutable_spec() = job_.spec();
    *request.add_chunks() = chunk;
    change(&request);
    grpc::ClientContext context;
    return FromGrpcStatus(shard_->SeedChunks(&context, request, response));
  };
  for (const Case& c : cases) {
    v1::SeedChunksResponse response;
    absl::Status s = prepare(c.change, &response);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.names));
  }
  v1::SeedChunksResponse unreachable;
  absl::Status s = prepare([](auto* r) { r->set_source_address("127.0.0.1:1"); }, &unreachable);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(unreachable.prepared(), 0u);

  auto read_log = [&](const std::function<void(v1::ReadStepLogRequest*)>& change,
                      v1::ReadStepLogResponse* response) {
    v1::ReadStepLogRequest request;
    request.set_job_id("bad-input");
    request.set_flat_begin(chunk.flat_begin());
    request.set_num_params(chunk.num_params());
    change(&request);
    grpc::ClientContext context;
    return FromGrpcStatus(shard_->ReadStepLog(&context, request, response));
  };
  v1::ReadStepLogResponse log;
  s = read_log([](auto*) {}, &log);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("keeps no step log"));
  s = read_log([](auto* r) { r->set_num_params((uint64_t{1} << 20) + 1); }, &log);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("num_params"));
  s = read_log([](auto* r) { r->set_job_id("nope"); }, &log);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  s = read_log([&](auto* r) { r->set_num_params(chunk.num_params() + 1); }, &log);
  EXPECT_NE(s.code(), absl::StatusCode::kOk);
  s = read_log([](auto* r) { r->set_start(true); }, &log);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(log.since_step(), log.applied_step());
  EXPECT_EQ(log.steps_size(), 0);
  s = read_log([](auto* r) { r->set_end(true); }, &log);
  EXPECT_TRUE(s.ok()) << s;
  s = read_log([](auto*) {}, &log);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  // A good one (the server its own source): the job is idle at step 2, so
  // the copy is built with its copy of step 1, and a fence only writes it;
  // aside, as the chunk here is no new copy awaiting its seed.
  v1::SeedChunksResponse built;
  s = prepare([](auto*) {}, &built);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(built.prepared(), 1u);
  EXPECT_EQ(built.previous(), 1u);
  EXPECT_EQ(built.in_place(), 0u);
}

TEST_F(BadInputTest, CheckpointRequestsNameTheProblem) {
  const testing::ScratchDir scratch("bad_input_checkpoints");
  const std::string& dir = scratch.path();
  auto save_chunks = [&](const std::string& job, int64_t step, const std::string& to) {
    v1::SaveChunksRequest request;
    request.set_job_id(job);
    request.set_step(step);
    request.set_dir(to);
    grpc::ClientContext context;
    v1::SaveChunksResponse response;
    return FromGrpcStatus(shard_->SaveChunks(&context, request, &response));
  };
  absl::Status s = save_chunks("nope", 2, dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("unknown job 'nope'"));
  s = save_chunks("bad-input", 2, "relative/dir");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not an absolute path"));
  // A wait for a step far ahead that would hold a checkpoint writer for ever.
  for (int64_t wait_ms : {int64_t{-1}, int64_t{1} << 62}) {
    v1::SaveChunksRequest request;
    request.set_job_id("bad-input");
    request.set_step(1000);
    request.set_dir(cluster_->data_dir());
    request.set_wait_ms(wait_ms);
    grpc::ClientContext context;
    v1::SaveChunksResponse response;
    s = FromGrpcStatus(shard_->SaveChunks(&context, request, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << wait_ms;
    EXPECT_THAT(s.message(), HasSubstr("wait_ms"));
  }
  // Directories outside the checkpoint root (the system's temporary
  // directory here), named directly or through '..' or a symlink: refused
  // before anything is written.
  std::filesystem::create_symlink("/etc", dir + "/etc-link");
  for (const std::string& outside :
       {std::string("/etc"), dir + "/../../etc", dir + "/etc-link", std::string("/")}) {
    s = save_chunks("bad-input", 2, outside);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_THAT(s.message(), HasSubstr("is not inside the --checkpoint_root")) << outside;
  }
  EXPECT_EQ(save_chunks("bad-input", -1, dir).code(), absl::StatusCode::kInvalidArgument);
  // Chunks that the server does not hold, or named twice (also as many
  // ids as it holds chunks, and across the two lists): refused, none armed.
  std::vector<uint32_t> held;
  for (const auto& c : job_.chunks()) {
    if (c.server_address() == chunk0_server_) held.push_back(c.chunk().chunk_id());
  }
  std::vector<uint32_t> one_twice = held;
  one_twice.back() = one_twice.front();
  ASSERT_GE(held.size(), 2u);
  struct Named {
    std::vector<uint32_t> saved, checksummed;
    const char* field;
  };
  for (const Named& named :
       {Named{{1u << 30}, {}, "chunk_ids: chunk "}, Named{{0, 0}, {}, "chunk_ids: chunk "},
        Named{one_twice, {}, "chunk_ids: chunk "},
        Named{{}, {1u << 30}, "checksum_chunk_ids: chunk "},
        Named{{held[0]}, {held[0]}, "checksum_chunk_ids: chunk "}}) {
    v1::SaveChunksRequest request;
    request.set_job_id("bad-input");
    request.set_step(1000);
    request.set_dir(cluster_->data_dir());
    request.mutable_chunk_ids()->Add(named.saved.begin(), named.saved.end());
    request.mutable_checksum_chunk_ids()->Add(named.checksummed.begin(), named.checksummed.end());
    grpc::ClientContext context;
    v1::SaveChunksResponse response;
    s = FromGrpcStatus(shard_->SaveChunks(&context, request, &response));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(named.field));
  }
  // A step the job is past: ABORTED, and nothing stays armed (TearDown steps on).
  s = save_chunks("bad-input", 1, dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("past the checkpoint's step 1"));

  // Loading into a job that has run steps, or from files that do not exist.
  v1::LoadChunksRequest load;
  load.set_job_id("bad-input");
  load.set_step(2);
  load.set_dir(dir);
  v1::CheckpointFile* file = load.add_files();
  *file->mutable_chunk() = job_.chunks(0).chunk();
  file->set_file("chunk-00000000.bin");
  grpc::ClientContext load_context;
  v1::LoadChunksResponse loaded;
  s = FromGrpcStatus(shard_->LoadChunks(&load_context, load, &loaded));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("chunk-00000000.bin is missing"));
  file->set_file("../escape.bin");
  grpc::ClientContext escape_context;
  s = FromGrpcStatus(shard_->LoadChunks(&escape_context, load, &loaded));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // A file of a directory outside the root: not even its size is told.
  file->set_file("passwd");
  load.set_dir("/etc");
  grpc::ClientContext etc_context;
  s = FromGrpcStatus(shard_->LoadChunks(&etc_context, load, &loaded));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not inside the --checkpoint_root"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("bytes")));
  load.set_dir(dir);

  // The coordinator: unknown job, relative directory, a restore from nowhere.
  v1::SaveCheckpointRequest save;
  save.set_job_id("nope");
  v1::CheckpointInfo info;
  grpc::ClientContext unknown_context;
  s = FromGrpcStatus(coordinator_->SaveCheckpoint(&unknown_context, save, &info));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  save.set_job_id("bad-input");
  save.set_dir("relative");
  grpc::ClientContext relative_context;
  s = FromGrpcStatus(coordinator_->SaveCheckpoint(&relative_context, save, &info));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not an absolute path"));
  save.set_dir(dir + "/../../etc");
  grpc::ClientContext etc_save_context;
  s = FromGrpcStatus(coordinator_->SaveCheckpoint(&etc_save_context, save, &info));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not inside the --checkpoint_root"));
  v1::ListCheckpointsRequest list;
  list.set_job_id("../x");
  v1::ListCheckpointsResponse listed;
  grpc::ClientContext list_context;
  EXPECT_EQ(FromGrpcStatus(coordinator_->ListCheckpoints(&list_context, list, &listed)).code(),
            absl::StatusCode::kInvalidArgument);
  v1::CreateJobRequest create;
  *create.mutable_spec() = job_.spec();
  create.mutable_spec()->set_job_id("from-nowhere");
  create.set_restore_from(dir + "/nothing-here");
  v1::JobInfo created;
  grpc::ClientContext create_context;
  s = FromGrpcStatus(coordinator_->CreateJob(&create_context, create, &created));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("is not a checkpoint"));
  // A restore from, or a job that checkpoints into, a directory outside the root.
  create.set_restore_from("/etc");
  grpc::ClientContext etc_restore_context;
  s = FromGrpcStatus(coordinator_->CreateJob(&etc_restore_context, create, &created));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("restore_from '/etc' is not inside"));
  create.clear_restore_from();
  create.mutable_spec()->set_checkpoint_dir(dir + "/../..");
  grpc::ClientContext etc_dir_context;
  s = FromGrpcStatus(coordinator_->CreateJob(&etc_dir_context, create, &created));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint_dir"));
  // A job whose id would make its checkpoints DIR/../step-N.
  create.mutable_spec()->clear_checkpoint_dir();
  create.mutable_spec()->set_job_id("..");
  grpc::ClientContext dot_dot_context;
  s = FromGrpcStatus(coordinator_->CreateJob(&dot_dot_context, create, &created));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job id '..'"));
}

// Sizes whose arithmetic wraps or whose counts are huge: refused, naming the
// field, before anything is allocated (these once copied server heap memory
// into a job's weights, and grew the coordinator without bound).
TEST_F(BadInputTest, WrappingSizesAndHugeCountsAreRefused) {
  const testing::ScratchDir scratch("bad_input_sizes");
  // A checkpoint file entry whose 12 * num_params wraps to a small size.
  const uint64_t wrapping = (uint64_t{1} << 62) + 16;
  std::ofstream(scratch.path() + "/chunk-00000000.bin") << std::string(12 * 16, 'x');
  v1::LoadChunksRequest load;
  load.set_job_id("bad-input");
  load.set_step(3);
  load.set_dir(scratch.path());
  v1::CheckpointFile* file = load.add_files();
  file->mutable_chunk()->set_flat_begin(0);
  file->mutable_chunk()->set_num_params(wrapping);
  file->set_file("chunk-00000000.bin");
  grpc::ClientContext load_context;
  v1::LoadChunksResponse loaded;
  absl::Status s = FromGrpcStatus(shard_->LoadChunks(&load_context, load, &loaded));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not a chunk"));
  // A range whose end wraps.
  file->mutable_chunk()->set_flat_begin(~uint64_t{0} - 8);
  file->mutable_chunk()->set_num_params(16);
  grpc::ClientContext end_context;
  s = FromGrpcStatus(shard_->LoadChunks(&end_context, load, &loaded));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  // Jobs whose chunk count truncates to 32 bits, exceeds the per-job limit,
  // or whose tensors sum past the largest model.
  auto create = [&](const std::vector<std::vector<int64_t>>& shapes, uint64_t chunk_num_params) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = job_.spec();
    request.mutable_spec()->set_job_id("huge");
    request.mutable_spec()->clear_tensors();
    for (size_t i = 0; i < shapes.size(); ++i) {
      v1::TensorSpec* t = request.mutable_spec()->add_tensors();
      t->set_name("t" + std::to_string(i));
      for (int64_t d : shapes[i]) t->add_shape(d);
    }
    request.mutable_spec()->set_chunk_num_params(chunk_num_params);
    grpc::ClientContext context;
    v1::JobInfo created;
    return FromGrpcStatus(coordinator_->CreateJob(&context, request, &created));
  };
  // 2^38 parameters in chunks of 64: 2^32 chunks, 0 when truncated.
  s = create({{int64_t{1} << 38}}, 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("chunks"));
  s = create({{int64_t{1} << 30}}, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than the maximum of 1048576 per job"));
  s = create(std::vector<std::vector<int64_t>>(20, {int64_t{1} << 40}), uint64_t{64} << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than 17592186044416 parameters"));
  // More copies per chunk than allowed, and more than the two live servers.
  auto create_copies = [&](uint32_t replicas) {
    v1::CreateJobRequest request;
    *request.mutable_spec() = job_.spec();
    request.mutable_spec()->set_job_id("copies");
    request.mutable_spec()->set_replicas(replicas);
    grpc::ClientContext context;
    v1::JobInfo created;
    return FromGrpcStatus(coordinator_->CreateJob(&context, request, &created));
  };
  for (uint32_t replicas : {4u, 1000000u}) {
    s = create_copies(replicas);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("replicas"));
  }
  s = create_copies(3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("2 live server(s)"));
  // A megabyte job id is named in 64 bytes, not echoed.
  v1::GetJobRequest get;
  get.set_job_id(std::string(1 << 20, 'j'));
  grpc::ClientContext get_context;
  v1::JobInfo job;
  s = FromGrpcStatus(coordinator_->GetJob(&get_context, get, &job));
  EXPECT_NE(s.code(), absl::StatusCode::kOk);
  EXPECT_LT(s.message().size(), 512u) << s.message().substr(0, 512);
}

// A checkpoint memory limit below the memory kept for checkpoints is a
// configuration error, refused at start-up with both figures.
TEST(ShardServerStartUpTest, ACheckpointMemoryLimitBelowTheKeptBufferIsRefused) {
  ShardServerOptions options;
  options.coordinator_address = "127.0.0.1:1";  // never reached
  const testing::ScratchDir scratch("checkpoint_limit_start_up_test");
  options.data_dir = scratch.path();
  options.checkpoint_buffer_bytes = uint64_t{64} << 20;
  options.checkpoint_memory_limit_bytes = uint64_t{32} << 20;
  auto server = ShardServer::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              ::testing::AllOf(::testing::HasSubstr("limit (32 MiB)"),
                               ::testing::HasSubstr("kept (64 MiB)")));
}

// A registration that would have the coordinator dial a malformed address
// or add budgets that overflow: refused, and the fleet stays as it was.
TEST_F(BadInputTest, MalformedServerRegistrationsAreRefused) {
  for (const std::string& address :
       {std::string("no-port"), std::string("evil host:1"), std::string(1 << 20, 'x') + ":1"}) {
    v1::RegisterServerRequest request;
    request.mutable_server()->set_address(address);
    request.mutable_server()->set_host_budget_bytes(1 << 20);
    v1::RegisterServerResponse response;
    absl::Status s = CallUnary(coordinator_.get(), &v1::Coordinator::Stub::RegisterServer, request,
                               &response, absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("server.address"));
  }
  v1::RegisterServerRequest huge;
  huge.mutable_server()->set_address("127.0.0.1:1");
  huge.mutable_server()->set_host_budget_bytes(~uint64_t{0});
  v1::RegisterServerResponse response;
  absl::Status s = CallUnary(coordinator_.get(), &v1::Coordinator::Stub::RegisterServer, huge,
                             &response, absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("server.host_budget_bytes"));
  // TearDown: placement and state unchanged, the job still trains.
}

// A pull of the next step whose caller gives up (its deadline) leaves no
// waiter behind on the chunk (they once stayed until the step came, without
// bound).
TEST_F(BadInputTest, APullWhoseCallerGivesUpLeavesNoWaiter) {
  auto waiting = [&] {
    v1::ListChunksRequest list;
    list.set_job_id("bad-input");
    v1::ListChunksResponse chunks;
    EXPECT_TRUE(CallUnary(shard_.get(), &v1::ShardServer::Stub::ListChunks, list, &chunks,
                          absl::Seconds(10))
                    .ok());
    uint32_t n = 0;
    for (const v1::ChunkStatus& c : chunks.chunks()) n += c.waiting_pulls();
    return n;
  };
  for (int i = 0; i < 20; ++i) {
    v1::PullRequest pull;
    pull.set_job_id("bad-input");
    pull.set_step(client_->step() + 1);
    pull.set_flat_begin(0);
    pull.set_num_params(64);
    v1::PullResponse response;
    absl::Status s = CallUnary(shard_.get(), &v1::ShardServer::Stub::Pull, pull, &response,
                               absl::Milliseconds(50));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (waiting() != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(waiting(), 0u);
}

// A pull of a step that never comes, from a caller with no deadline of its
// own: the server answers it DEADLINE_EXCEEDED after its maximum wait and
// keeps no waiter.
TEST(PullWaitTest, APullWaitsNoLongerThanTheServersMaximum) {
  LocalClusterOptions options;
  options.num_servers = 1;
  options.max_pull_wait = absl::Milliseconds(300);
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "pull-wait");
  o.job.world_size = 1;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE(testing::TrainStep(**client).ok());

  auto shard = v1::ShardServer::NewStub(MakeChannel((*cluster)->servers()[0]->address()));
  v1::PullRequest pull;
  pull.set_job_id("pull-wait");
  pull.set_step((*client)->step() + 1);
  pull.set_num_params(64);
  grpc::ClientContext no_deadline;
  v1::PullResponse response;
  const absl::Time sent = absl::Now();
  absl::Status s = FromGrpcStatus(shard->Pull(&no_deadline, pull, &response));
  const absl::Duration waited = absl::Now() - sent;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("the most a pull may"));
  EXPECT_GE(waited, absl::Milliseconds(300));
  EXPECT_LT(waited, absl::Seconds(30));
  v1::ListChunksRequest list;
  list.set_job_id("pull-wait");
  v1::ListChunksResponse chunks;
  ASSERT_TRUE(
      CallUnary(shard.get(), &v1::ShardServer::Stub::ListChunks, list, &chunks, absl::Seconds(10))
          .ok());
  for (const v1::ChunkStatus& c : chunks.chunks()) EXPECT_EQ(c.waiting_pulls(), 0u);
  // The job trains on.
  ASSERT_TRUE(testing::TrainStep(**client).ok());
}

TEST_F(BadInputTest, MembershipRequestsNameTheProblem) {
  auto call = [&](auto method, const auto& request, auto* response) {
    return CallUnary(coordinator_.get(), method, request, response, absl::Seconds(10));
  };
  v1::ListMembersRequest list;
  list.set_job_id("bad-input");
  v1::ListMembersResponse members_before;
  ASSERT_TRUE(call(&v1::Coordinator::Stub::ListMembers, list, &members_before).ok());

  v1::JoinJobRequest join;
  join.set_job_id("bad-input");
  join.set_worker_id("bad/id");
  v1::JoinJobResponse joined;
  absl::Status s = call(&v1::Coordinator::Stub::JoinJob, join, &joined);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("worker id 'bad/id'"));
  join.set_job_id("no-such-job");
  join.set_worker_id("w");
  s = call(&v1::Coordinator::Stub::JoinJob, join, &joined);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no-such-job"));

  v1::HeartbeatRequest beat;
  beat.set_job_id("bad-input");
  beat.set_worker_id("ghost");
  v1::HeartbeatResponse beat_response;
  s = call(&v1::Coordinator::Stub::Heartbeat, beat, &beat_response);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'ghost' is not a member of job 'bad-input'"));
  v1::LeaveJobRequest leave;
  leave.set_job_id("bad-input");
  leave.set_worker_id("ghost");
  v1::LeaveJobResponse left;
  s = call(&v1::Coordinator::Stub::LeaveJob, leave, &left);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  v1::RenewGenerationRequest renew;
  renew.set_job_id("bad-input");
  renew.set_worker_id("ghost");
  renew.set_generation(members_before.generation().number());
  v1::RenewGenerationResponse renewed;
  s = call(&v1::Coordinator::Stub::RenewGeneration, renew, &renewed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'ghost' is not a member of job 'bad-input'"));
  renew.set_worker_id("only");
  renew.set_reason(std::string(1025, 'x'));
  s = call(&v1::Coordinator::Stub::RenewGeneration, renew, &renewed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reason: 1025 bytes; at most 1024"));
  // A generation that is not the newest opens none.
  renew.set_reason("stale");
  renew.set_generation(members_before.generation().number() + 7);
  s = call(&v1::Coordinator::Stub::RenewGeneration, renew, &renewed);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(renewed.generation().number(), members_before.generation().number());

  grpc::ClientContext context;
  v1::WatchGenerationRequest watch;
  watch.set_job_id("no-such-job");
  auto reader = coordinator_->WatchGeneration(&context, watch);
  v1::Generation generation;
  EXPECT_FALSE(reader->Read(&generation));
  s = FromGrpcStatus(reader->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no-such-job"));

  // The job's membership is as it was, and Step(GradientFn) needs a batch.
  v1::ListMembersResponse members_after;
  ASSERT_TRUE(call(&v1::Coordinator::Stub::ListMembers, list, &members_after).ok());
  EXPECT_EQ(members_after.generation().SerializeAsString(),
            members_before.generation().SerializeAsString());
  ASSERT_EQ(members_after.members_size(), 1);
  EXPECT_EQ(members_after.members(0).worker_id(), "only");
  auto stepped = client_->Step([](const MicroBatch&, Client&) { return absl::OkStatus(); });
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stepped.status().message(), HasSubstr("samples_per_step"));
}

TEST_F(BadInputTest, AStalePushOfAnOlderGenerationIsReplacedNotApplied) {
  // A push left by a generation before the client's (0 < 1) stays staged
  // until the client's own pushes of the step replace it.
  v1::PushRequest stale = GoodPush();
  stale.set_generation(0);
  stale.set_grads(std::string(128, '\x7b'));  // huge FP16 values: applied, they would show
  absl::Status stale_status;
  std::thread pusher([&] { stale_status = Push(stale); });
  auto shard = v1::ShardServer::NewStub(MakeChannel(chunk0_server_));
  bool staged = false;
  for (int i = 0; i < 500 && !staged; ++i) {
    v1::ListChunksRequest list;
    list.set_job_id("bad-input");
    v1::ListChunksResponse chunks;
    ASSERT_TRUE(
        CallUnary(shard.get(), &v1::ShardServer::Stub::ListChunks, list, &chunks, absl::Seconds(10))
            .ok());
    for (const auto& c : chunks.chunks()) staged |= c.chunk().chunk_id() == 0 && c.staged_params();
    if (!staged) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(staged);
  Step();
  pusher.join();
  EXPECT_EQ(stale_status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale_status.message(), HasSubstr("replaced by generation 1"));
  // The step applied the client's gradients (N(0, 0.1)) only: the stale
  // ones (about 6e4) would have left exp_avg near 6e3 in [0, 64).
  MasterState after = *client_->ReadMasterState();
  EXPECT_EQ(after.step, before_state_.step + 1);
  for (int i = 0; i < 64; ++i) ASSERT_LT(std::abs(after.exp_avg[i]), 1.0f) << i;
  before_placement_ = Placement();
  before_state_ = after;
}

}  // namespace
}  // namespace strata
