#include "rpc/authorized_services.h"

#include "rpc/auth_policy.h"
#include "rpc/certified_host.h"
#include "rpc/grpc_status.h"
#include "rpc/rendezvous_keys.h"
#include "rpc/step_wire.h"

namespace strata {
namespace {

// Calls `handler` of `service` when `gate` admits the call, else answers it.
// (`handler` is a member of the generated base class that declares it.)
template <typename Service, typename Base, typename Request, typename Response>
grpc::ServerUnaryReactor* Gated(
    const AuthGate& gate, Service* service, absl::string_view method, absl::string_view job_id,
    grpc::ServerUnaryReactor* (Base::*handler)(grpc::CallbackServerContext*, const Request*,
                                               Response*),
    grpc::CallbackServerContext* ctx, const Request* request, Response* response) {
  if (absl::Status s = gate.Admit(*ctx, method, job_id); !s.ok()) return FinishUnary(ctx, s);
  return (service->*handler)(ctx, request, response);
}

// The job that a raw request of type `Request` names; empty for one that
// does not parse, which the service refuses once the call is admitted.
template <typename Request>
std::string JobOfRaw(const grpc::ByteBuffer& raw) {
  Request parsed;
  ParseMessageBuffer(raw, &parsed);
  return parsed.job_id();
}

// A push's job, read without copying its gradients.
template <>
std::string JobOfRaw<v1::PushRequest>(const grpc::ByteBuffer& raw) {
  std::unique_ptr<PushMessage> parsed = PushMessage::Parse(raw);
  return parsed != nullptr ? parsed->fields().job_id() : std::string();
}

// A stream refused before it started.
class RefusedGenerationStream final : public grpc::ServerWriteReactor<v1::Generation> {
 public:
  explicit RefusedGenerationStream(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

// Each override below passes its own name and the request's job.
#define STRATA_GATED(Service, Method, job_id) \
  Gated(gate_, service_, #Method, job_id, &Service::Method, ctx, request, response)

absl::Status AuthGate::Admit(const grpc::CallbackServerContext& ctx, absl::string_view method,
                             absl::string_view job_id) const {
  absl::StatusOr<Identity> who = auth_->Identify(ctx);
  if (!who.ok()) return who.status();
  std::optional<std::string> owner;
  if (owners_ != nullptr && !job_id.empty()) owner = owners_->OwnerOf(job_id);
  return Authorize(*who, service_, method, job_id, owner);
}

AuthorizedCoordinator::AuthorizedCoordinator(v1::Coordinator::CallbackService* service,
                                             const Authenticator* auth, const JobOwners* owners)
    : service_(service), gate_(v1::Coordinator::service_full_name(), auth, owners) {}

using CoordinatorBase = v1::Coordinator::CallbackService;

grpc::ServerUnaryReactor* AuthorizedCoordinator::RegisterServer(
    grpc::CallbackServerContext* ctx, const v1::RegisterServerRequest* request,
    v1::RegisterServerResponse* response) {
  if (absl::Status s = gate_.Admit(*ctx, "RegisterServer", ""); !s.ok()) {
    return FinishUnary(ctx, s);
  }
  // The coordinator dials the address: one the server's certificate names.
  absl::Status certified = CheckCertifiedHost(*ctx, "server.address", request->server().address());
  if (!certified.ok()) return FinishUnary(ctx, certified);
  return service_->RegisterServer(ctx, request, response);
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::CreateJob(grpc::CallbackServerContext* ctx,
                                                           const v1::CreateJobRequest* request,
                                                           v1::JobInfo* response) {
  return STRATA_GATED(CoordinatorBase, CreateJob, request->spec().job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::GetJob(grpc::CallbackServerContext* ctx,
                                                        const v1::GetJobRequest* request,
                                                        v1::JobInfo* response) {
  return STRATA_GATED(CoordinatorBase, GetJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::ListJobs(grpc::CallbackServerContext* ctx,
                                                          const v1::ListJobsRequest* request,
                                                          v1::ListJobsResponse* response) {
  return STRATA_GATED(CoordinatorBase, ListJobs, "");
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::DeleteJob(grpc::CallbackServerContext* ctx,
                                                           const v1::DeleteJobRequest* request,
                                                           v1::DeleteJobResponse* response) {
  return STRATA_GATED(CoordinatorBase, DeleteJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::JoinJob(grpc::CallbackServerContext* ctx,
                                                         const v1::JoinJobRequest* request,
                                                         v1::JoinJobResponse* response) {
  return STRATA_GATED(CoordinatorBase, JoinJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::Heartbeat(grpc::CallbackServerContext* ctx,
                                                           const v1::HeartbeatRequest* request,
                                                           v1::HeartbeatResponse* response) {
  return STRATA_GATED(CoordinatorBase, Heartbeat, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::LeaveJob(grpc::CallbackServerContext* ctx,
                                                          const v1::LeaveJobRequest* request,
                                                          v1::LeaveJobResponse* response) {
  return STRATA_GATED(CoordinatorBase, LeaveJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::RenewGeneration(
    grpc::CallbackServerContext* ctx, const v1::RenewGenerationRequest* request,
    v1::RenewGenerationResponse* response) {
  return STRATA_GATED(CoordinatorBase, RenewGeneration, request->job_id());
}
grpc::ServerWriteReactor<v1::Generation>* AuthorizedCoordinator::WatchGeneration(
    grpc::CallbackServerContext* ctx, const v1::WatchGenerationRequest* request) {
  if (absl::Status s = gate_.Admit(*ctx, "WatchGeneration", request->job_id()); !s.ok()) {
    return new RefusedGenerationStream(s);
  }
  return service_->WatchGeneration(ctx, request);
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::ListMembers(grpc::CallbackServerContext* ctx,
                                                             const v1::ListMembersRequest* request,
                                                             v1::ListMembersResponse* response) {
  return STRATA_GATED(CoordinatorBase, ListMembers, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::GetPlacement(
    grpc::CallbackServerContext* ctx, const v1::GetPlacementRequest* request,
    v1::GetPlacementResponse* response) {
  return STRATA_GATED(CoordinatorBase, GetPlacement, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::SaveCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::SaveCheckpointRequest* request,
    v1::CheckpointInfo* response) {
  return STRATA_GATED(CoordinatorBase, SaveCheckpoint, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return STRATA_GATED(CoordinatorBase, ListCheckpoints, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::DrainServer(grpc::CallbackServerContext* ctx,
                                                             const v1::DrainServerRequest* request,
                                                             v1::DrainServerResponse* response) {
  return STRATA_GATED(CoordinatorBase, DrainServer, "");
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::RebalanceJob(
    grpc::CallbackServerContext* ctx, const v1::RebalanceJobRequest* request,
    v1::RebalanceJobResponse* response) {
  return STRATA_GATED(CoordinatorBase, RebalanceJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::KvSet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvSetRequest* request,
                                                       v1::KvSetResponse* response) {
  return STRATA_GATED(CoordinatorBase, KvSet, JobOfRendezvousKey(request->key()));
}
grpc::ServerUnaryReactor* AuthorizedCoordinator::KvGet(grpc::CallbackServerContext* ctx,
                                                       const v1::KvGetRequest* request,
                                                       v1::KvGetResponse* response) {
  return STRATA_GATED(CoordinatorBase, KvGet, JobOfRendezvousKey(request->key()));
}

AuthorizedShardServer::AuthorizedShardServer(ShardServerService* service, const Authenticator* auth)
    : service_(service), gate_(v1::ShardServer::service_full_name(), auth, nullptr) {}

using ShardBase = v1::ShardServer::CallbackService;
using RawBase = ShardServerService;

grpc::ServerUnaryReactor* AuthorizedShardServer::AllocateChunks(
    grpc::CallbackServerContext* ctx, const v1::AllocateChunksRequest* request,
    v1::AllocateChunksResponse* response) {
  return STRATA_GATED(ShardBase, AllocateChunks, request->spec().job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::DropJob(grpc::CallbackServerContext* ctx,
                                                         const v1::DropJobRequest* request,
                                                         v1::DropJobResponse* response) {
  return STRATA_GATED(ShardBase, DropJob, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::WriteParams(grpc::CallbackServerContext* ctx,
                                                             const v1::WriteParamsRequest* request,
                                                             v1::WriteParamsResponse* response) {
  return STRATA_GATED(ShardBase, WriteParams, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::WriteState(grpc::CallbackServerContext* ctx,
                                                            const v1::WriteStateRequest* request,
                                                            v1::WriteStateResponse* response) {
  return STRATA_GATED(ShardBase, WriteState, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::Push(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return STRATA_GATED(RawBase, Push, JobOfRaw<v1::PushRequest>(*request));
}
grpc::ServerUnaryReactor* AuthorizedShardServer::CommitStep(grpc::CallbackServerContext* ctx,
                                                            const v1::CommitStepRequest* request,
                                                            v1::CommitStepResponse* response) {
  return STRATA_GATED(ShardBase, CommitStep, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::Pull(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return STRATA_GATED(RawBase, Pull, JobOfRaw<v1::PullRequest>(*request));
}
grpc::ServerUnaryReactor* AuthorizedShardServer::ReadState(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* request,
                                                           grpc::ByteBuffer* response) {
  return STRATA_GATED(RawBase, ReadState, JobOfRaw<v1::ReadStateRequest>(*request));
}
grpc::ServerUnaryReactor* AuthorizedShardServer::ListChunks(grpc::CallbackServerContext* ctx,
                                                            const v1::ListChunksRequest* request,
                                                            v1::ListChunksResponse* response) {
  return STRATA_GATED(ShardBase, ListChunks, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::SaveChunks(grpc::CallbackServerContext* ctx,
                                                            const v1::SaveChunksRequest* request,
                                                            v1::SaveChunksResponse* response) {
  return STRATA_GATED(ShardBase, SaveChunks, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::LoadChunks(grpc::CallbackServerContext* ctx,
                                                            const v1::LoadChunksRequest* request,
                                                            v1::LoadChunksResponse* response) {
  return STRATA_GATED(ShardBase, LoadChunks, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::SeedChunks(grpc::CallbackServerContext* ctx,
                                                            const v1::SeedChunksRequest* request,
                                                            v1::SeedChunksResponse* response) {
  return STRATA_GATED(ShardBase, SeedChunks, request->job_id());
}
grpc::ServerUnaryReactor* AuthorizedShardServer::ReadStepLog(grpc::CallbackServerContext* ctx,
                                                             const v1::ReadStepLogRequest* request,
                                                             v1::ReadStepLogResponse* response) {
  return STRATA_GATED(ShardBase, ReadStepLog, request->job_id());
}

#undef STRATA_GATED

}  // namespace strata
