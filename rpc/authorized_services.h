// The authorization edge: AuthorizedCoordinator and AuthorizedShardServer
// wrap a daemon's service. Each call is authenticated (Authenticator) and
// checked against the policy table (rpc/auth_policy.h) for the request's job
// before it reaches the service; a refused call is answered with the
// policy's status and never reaches it, so nothing changes. The services
// themselves check no role (CoordinatorService asks the Authenticator who
// the caller is only to record a job's owner). Thread-safe when the wrapped
// service, the Authenticator and the JobOwners are; all must outlive the
// wrapper.
#ifndef STRATA_RPC_AUTHORIZED_SERVICES_H_
#define STRATA_RPC_AUTHORIZED_SERVICES_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rpc/authenticator.h"
#include "rpc/shard_server_service.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

// The owners of a daemon's jobs.
class JobOwners {
 public:
  virtual ~JobOwners() = default;
  // The owner of `job_id` ("" for a job made without authentication);
  // nullopt when there is no such job.
  virtual std::optional<std::string> OwnerOf(absl::string_view job_id) const = 0;
};

// Authenticates and authorizes calls of one service.
class AuthGate {
 public:
  // `owners` may be null: the daemon has no users (a shard server).
  AuthGate(absl::string_view service, const Authenticator* auth, const JobOwners* owners)
      : service_(service), auth_(auth), owners_(owners) {}
  // OK when the caller of `ctx` may call `method` on `job_id`.
  absl::Status Admit(const grpc::CallbackServerContext& ctx, absl::string_view method,
                     absl::string_view job_id) const;

 private:
  const absl::string_view service_;
  const Authenticator* const auth_;
  const JobOwners* const owners_;
};

class AuthorizedCoordinator final : public v1::Coordinator::CallbackService {
 public:
  AuthorizedCoordinator(v1::Coordinator::CallbackService* service, const Authenticator* auth,
                        const JobOwners* owners);

  grpc::ServerUnaryReactor* RegisterServer(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterServerRequest* request,
                                           v1::RegisterServerResponse* response) override;
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const v1::CreateJobRequest* request,
                                      v1::JobInfo* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* request,
                                   v1::JobInfo* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const v1::JoinJobRequest* request,
                                    v1::JoinJobResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx,
                                     const v1::LeaveJobRequest* request,
                                     v1::LeaveJobResponse* response) override;
  grpc::ServerUnaryReactor* RenewGeneration(grpc::CallbackServerContext* ctx,
                                            const v1::RenewGenerationRequest* request,
                                            v1::RenewGenerationResponse* response) override;
  grpc::ServerWriteReactor<v1::Generation>* WatchGeneration(
      grpc::CallbackServerContext* ctx, const v1::WatchGenerationRequest* request) override;
  grpc::ServerUnaryReactor* ListMembers(grpc::CallbackServerContext* ctx,
                                        const v1::ListMembersRequest* request,
                                        v1::ListMembersResponse* response) override;
  grpc::ServerUnaryReactor* GetPlacement(grpc::CallbackServerContext* ctx,
                                         const v1::GetPlacementRequest* request,
                                         v1::GetPlacementResponse* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* ctx,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::CheckpointInfo* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* DrainServer(grpc::CallbackServerContext* ctx,
                                        const v1::DrainServerRequest* request,
                                        v1::DrainServerResponse* response) override;
  grpc::ServerUnaryReactor* RebalanceJob(grpc::CallbackServerContext* ctx,
                                         const v1::RebalanceJobRequest* request,
                                         v1::RebalanceJobResponse* response) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* request,
                                  v1::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) override;

 private:
  v1::Coordinator::CallbackService* const service_;
  const AuthGate gate_;
};

class AuthorizedShardServer final : public ShardServerService {
 public:
  AuthorizedShardServer(ShardServerService* service, const Authenticator* auth);

  grpc::ServerUnaryReactor* AllocateChunks(grpc::CallbackServerContext* ctx,
                                           const v1::AllocateChunksRequest* request,
                                           v1::AllocateChunksResponse* response) override;
  grpc::ServerUnaryReactor* DropJob(grpc::CallbackServerContext* ctx,
                                    const v1::DropJobRequest* request,
                                    v1::DropJobResponse* response) override;
  grpc::ServerUnaryReactor* WriteParams(grpc::CallbackServerContext* ctx,
                                        const v1::WriteParamsRequest* request,
                                        v1::WriteParamsResponse* response) override;
  grpc::ServerUnaryReactor* WriteState(grpc::CallbackServerContext* ctx,
                                       const v1::WriteStateRequest* request,
                                       v1::WriteStateResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext* ctx,
                                       const v1::CommitStepRequest* request,
                                       v1::CommitStepResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReadState(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListChunks(grpc::CallbackServerContext* ctx,
                                       const v1::ListChunksRequest* request,
                                       v1::ListChunksResponse* response) override;
  grpc::ServerUnaryReactor* SaveChunks(grpc::CallbackServerContext* ctx,
                                       const v1::SaveChunksRequest* request,
                                       v1::SaveChunksResponse* response) override;
  grpc::ServerUnaryReactor* LoadChunks(grpc::CallbackServerContext* ctx,
                                       const v1::LoadChunksRequest* request,
                                       v1::LoadChunksResponse* response) override;
  grpc::ServerUnaryReactor* SeedChunks(grpc::CallbackServerContext* ctx,
                                       const v1::SeedChunksRequest* request,
                                       v1::SeedChunksResponse* response) override;
  grpc::ServerUnaryReactor* ReadStepLog(grpc::CallbackServerContext* ctx,
                                        const v1::ReadStepLogRequest* request,
                                        v1::ReadStepLogResponse* response) override;

 private:
  ShardServerService* const service_;
  const AuthGate gate_;
};

}  // namespace strata

#endif  // STRATA_RPC_AUTHORIZED_SERVICES_H_
