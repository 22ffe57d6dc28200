// Fuzzes the request handling of both services over real gRPC on loopback:
// a coordinator and a shard server in this process (testing/local_cluster.h)
// with job "fuzz" at step 1, and every input one request of any RPC.
// Input: 1 byte choosing the RPC, 1 byte of flags (bit 0: name job "fuzz"
// where the request leaves its job id empty), then the request's protobuf
// bytes (an input that does not parse is skipped; every address in it is
// pointed at loopback). Whatever the request,
// the daemons must answer with a status and go on: ASan, UBSan and the
// harness's own checks (the job's placement still served) catch the rest.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

constexpr char kJob[] = "fuzz";

struct World {
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<Client> client;  // a member of kJob, at step 1
  std::unique_ptr<v1::Coordinator::Stub> coordinator;
  std::unique_ptr<v1::ShardServer::Stub> server;
};

World* Start() {
  auto* world = new World;
  LocalClusterOptions options;
  options.num_servers = 1;
  options.host_budget_bytes = uint64_t{64} << 20;
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) std::abort();
  world->cluster = *std::move(cluster);
  ClientOptions worker;
  worker.coordinator_address = world->cluster->coordinator_address();
  worker.job_id = kJob;
  worker.worker_id = "w";
  worker.job.world_size = 1;
  worker.job.tensors = {{"w", {1000}}, {"b", {10}}};
  worker.job.chunk_num_params = 256;
  worker.job.dtype = DType::kFp32;
  auto client = Client::Connect(worker);
  if (!client.ok()) std::abort();
  world->client = *std::move(client);
  const std::vector<float> grads(world->client->layout().num_params(), 0.5f);
  if (!world->client->AccumulateGradients(grads).ok() || !world->client->Step().ok()) {
    std::abort();
  }
  world->coordinator = v1::Coordinator::NewStub(MakeChannel(world->cluster->coordinator_address()));
  world->server = v1::ShardServer::NewStub(MakeChannel(world->cluster->servers()[0]->address()));
  return world;
}

// Sets job_id (of the request, or of its spec) to kJob where it is empty.
void NameTheJob(google::protobuf::Message* request) {
  const google::protobuf::Descriptor* d = request->GetDescriptor();
  const google::protobuf::Reflection* r = request->GetReflection();
  if (const auto* field = d->FindFieldByName("job_id"); field != nullptr) {
    if (r->GetString(*request, field).empty()) r->SetString(request, field, kJob);
  }
  if (const auto* spec = d->FindFieldByName("spec"); spec != nullptr) {
    NameTheJob(r->MutableMessage(request, spec));
  }
}

// Points every address a request names (source_address, a SeedChunks
// source; address, at the top or in `server`: a RegisterServer the
// coordinator would then dial) at loopback, keeping what follows the last
// ':' (the port, valid or not): the daemons dial what they are told, and
// a fuzzed address must reach no host but this one.
void PinToLoopback(google::protobuf::Message* request) {
  const google::protobuf::Descriptor* d = request->GetDescriptor();
  const google::protobuf::Reflection* r = request->GetReflection();
  for (const char* name : {"source_address", "address"}) {
    const auto* field = d->FindFieldByName(name);
    if (field == nullptr || field->is_repeated() ||
        field->type() != google::protobuf::FieldDescriptor::TYPE_STRING) {
      continue;
    }
    const std::string value = r->GetString(*request, field);
    const size_t colon = value.rfind(':');
    r->SetString(
        request, field,
        "127.0.0.1" + (colon == std::string::npos ? std::string(":1") : value.substr(colon)));
  }
  if (const auto* server = d->FindFieldByName("server");
      server != nullptr && server->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
    PinToLoopback(r->MutableMessage(request, server));
  }
}

template <typename Stub, typename Request, typename Response>
void Call(Stub* stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
          const uint8_t* data, size_t size, bool name_job) {
  Request request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  if (name_job) NameTheJob(&request);
  PinToLoopback(&request);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  Response response;
  (stub->*method)(&context, request, &response);
}

void Watch(v1::Coordinator::Stub* stub, const uint8_t* data, size_t size, bool name_job) {
  v1::WatchGenerationRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  if (name_job) NameTheJob(&request);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
  auto reader = stub->WatchGeneration(&context, request);
  v1::Generation generation;
  while (reader->Read(&generation)) {
  }
  reader->Finish();
}

using Rpc = std::function<void(World&, const uint8_t*, size_t, bool)>;

const std::vector<Rpc>& Rpcs() {
  using C = v1::Coordinator::Stub;
  using S = v1::ShardServer::Stub;
#define STRATA_COORDINATOR_RPC(Method)               \
  [](World& w, const uint8_t* d, size_t n, bool j) { \
    Call(w.coordinator.get(), &C::Method, d, n, j);  \
  }
#define STRATA_SHARD_RPC(Method) \
  [](World& w, const uint8_t* d, size_t n, bool j) { Call(w.server.get(), &S::Method, d, n, j); }
  static const auto* rpcs = new std::vector<Rpc>{
      STRATA_COORDINATOR_RPC(RegisterServer),
      STRATA_COORDINATOR_RPC(CreateJob),
      STRATA_COORDINATOR_RPC(GetJob),
      STRATA_COORDINATOR_RPC(ListJobs),
      STRATA_COORDINATOR_RPC(DeleteJob),
      STRATA_COORDINATOR_RPC(JoinJob),
      STRATA_COORDINATOR_RPC(Heartbeat),
      STRATA_COORDINATOR_RPC(LeaveJob),
      STRATA_COORDINATOR_RPC(RenewGeneration),
      STRATA_COORDINATOR_RPC(ListMembers),
      STRATA_COORDINATOR_RPC(GetPlacement),
      STRATA_COORDINATOR_RPC(SaveCheckpoint),
      STRATA_COORDINATOR_RPC(ListCheckpoints),
      STRATA_COORDINATOR_RPC(KvSet),
      STRATA_COORDINATOR_RPC(KvGet),
      [](World& w, const uint8_t* d, size_t n, bool j) { Watch(w.coordinator.get(), d, n, j); },
      STRATA_SHARD_RPC(AllocateChunks),
      STRATA_SHARD_RPC(DropJob),
      STRATA_SHARD_RPC(WriteParams),
      STRATA_SHARD_RPC(WriteState),
      STRATA_SHARD_RPC(Push),
      STRATA_SHARD_RPC(Pull),
      STRATA_SHARD_RPC(ReadState),
      STRATA_SHARD_RPC(ListChunks),
      STRATA_SHARD_RPC(SaveChunks),
      STRATA_SHARD_RPC(LoadChunks),
      STRATA_SHARD_RPC(CommitStep),
      STRATA_COORDINATOR_RPC(DrainServer),
      STRATA_COORDINATOR_RPC(RebalanceJob),
      STRATA_SHARD_RPC(SeedChunks),
      STRATA_SHARD_RPC(ReadStepLog),
  };
#undef STRATA_COORDINATOR_RPC
#undef STRATA_SHARD_RPC
  return *rpcs;
}

}  // namespace
}  // namespace strata

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::World* world = strata::Start();
  if (size < 2) return 0;
  const auto& rpcs = strata::Rpcs();
  rpcs[data[0] % rpcs.size()](*world, data + 2, size - 2, (data[1] & 1) != 0);
  // The coordinator still answers.
  strata::v1::ListJobsResponse jobs;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!world->coordinator->ListJobs(&context, strata::v1::ListJobsRequest(), &jobs).ok()) {
    __builtin_trap();
  }
  return 0;
}
