// CoordinatorService: the gRPC Coordinator service
// (proto/strata/v1/coordinator.proto). It registers shard servers, creates
// jobs and assigns their chunks to servers balanced by bytes, keeps each
// job's workers and generations (Membership), and serves the rendezvous
// key-value store. All state is
// written to RocksDB before a request is answered, and reloaded at start.
// Thread-safe; calls to shard servers are asynchronous (FanOut).
#ifndef STRATA_SERVER_COORDINATOR_SERVICE_H_
#define STRATA_SERVER_COORDINATOR_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "server/membership.h"
#include "storage/metadata_store.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  // `worker_lease`: how long a worker stays a member without a heartbeat.
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(MetadataStore* metadata,
                                                                    absl::Duration worker_lease);

  // Before the gRPC server shuts down: stops expiring leases and ends the
  // generation streams.
  void BeginShutdown() { membership_->Stop(); }
  // Exports the registered servers and jobs, and per job its members,
  // generation and committed step, into `metrics` (which must outlive the
  // service).
  void ExportMetrics(Metrics* metrics);

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
  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const v1::JoinJobRequest* request,
                                    v1::JoinJobResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx,
                                     const v1::LeaveJobRequest* request,
                                     v1::LeaveJobResponse* response) override;
  grpc::ServerWriteReactor<v1::Generation>* WatchGeneration(
      grpc::CallbackServerContext* ctx, const v1::WatchGenerationRequest* request) override;
  grpc::ServerUnaryReactor* ListMembers(grpc::CallbackServerContext* ctx,
                                        const v1::ListMembersRequest* request,
                                        v1::ListMembersResponse* response) override;
  grpc::ServerUnaryReactor* GetPlacement(grpc::CallbackServerContext* ctx,
                                         const v1::GetPlacementRequest* request,
                                         v1::GetPlacementResponse* response) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* request,
                                  v1::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) override;

 private:
  CoordinatorService(MetadataStore* metadata, std::unique_ptr<Membership> membership);
  absl::Status Load();
  absl::Status DoRegister(const v1::RegisterServerRequest& request);
  // Validates the spec and assigns chunks; fills `job`. Marks the job as
  // being created. OK with `*existing` set when the same job exists.
  absl::Status PlanJob(const v1::JobSpec& spec, v1::JobInfo* job, bool* existing);
  void FinishCreate(const v1::JobInfo& job, absl::Status status);
  absl::StatusOr<v1::JobInfo> FindJob(const std::string& job_id) const;
  v1::ShardServer::Stub* StubFor(const std::string& address);

  MetadataStore* const metadata_;
  const std::unique_ptr<Membership> membership_;
  mutable absl::Mutex mu_;
  std::map<std::string, v1::ServerRecord> servers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::JobInfo> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> creating_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<v1::ShardServer::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CollectFunction> collected_;  // ExportMetrics
};

}  // namespace strata

#endif  // STRATA_SERVER_COORDINATOR_SERVICE_H_
