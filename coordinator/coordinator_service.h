// CoordinatorService: the gRPC Coordinator service
// (proto/strata/v1/coordinator.proto). It registers shard servers, creates
// jobs and assigns their chunks to live servers balanced by bytes, keeps
// each job's workers and generations (Membership), saves checkpoints, and
// serves the rendezvous key-value store. It watches the servers' health
// (ServerMonitor): the chunks of a job on a server lost for longer than the
// server timeout move to the live servers, every chunk restored from the
// job's newest checkpoint, and a new generation makes the workers resume
// from its step. All state is written to RocksDB before a request is
// answered, and reloaded at start (coordinator/job_registry.h).
// Placement is a pure function (coordinator/placement.h), calls to the shard
// servers go through ShardFleet, the key-value store is a RendezvousStore
// whose job keys go with the job, and generations stream through
// coordinator/generation_stream.h.
// Thread-safe; calls to shard servers from RPCs are asynchronous (FanOut);
// moves run on the monitor's thread.
#ifndef STRATA_COORDINATOR_COORDINATOR_SERVICE_H_
#define STRATA_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/checkpointer.h"
#include "coordinator/job_registry.h"
#include "coordinator/membership.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/retry_backoff.h"
#include "coordinator/seed_plan.h"
#include "coordinator/server_monitor.h"
#include "coordinator/shard_fleet.h"
#include "core/thread_pool.h"
#include "rpc/authenticator.h"
#include "rpc/authorized_services.h"
#include "rpc/metrics.h"
#include "storage/metadata_store.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class CoordinatorService final : public v1::Coordinator::CallbackService,
                                 public WorkerTokens,
                                 public JobOwners {
 public:
  // `worker_lease`: how long a worker stays a member without a heartbeat.
  // `checkpoint_dir`: where jobs without their own directory save checkpoints.
  // `checkpoint_root`: the directory every checkpoint directory of a request
  // must lie in (empty: `checkpoint_dir`). `server_timeout`: how long a shard
  // server may fail its health checks before its jobs' chunks move.
  // `shard_credentials`: how it calls the shard servers (rpc/tls.h).
  static absl::StatusOr<std::unique_ptr<CoordinatorService>> Create(
      MetadataStore* metadata, absl::Duration worker_lease, std::string checkpoint_dir,
      const std::string& checkpoint_root, absl::Duration server_timeout,
      ChannelCredentials shard_credentials);
  ~CoordinatorService() override;

  // With authentication on (before serving): who creates a job becomes its
  // owner, and each new job gets a worker token (JobInfo). `auth` must
  // outlive the service.
  void SetAuthenticator(const Authenticator* auth) { auth_ = auth; }
  std::optional<std::string> JobOfToken(absl::string_view digest) const override;
  std::optional<std::string> OwnerOf(absl::string_view job_id) const override;

  // Before the gRPC server shuts down: stops watching servers, expiring
  // leases, ends the generation streams and stops checkpoint saves.
  void BeginShutdown();
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
  CoordinatorService(MetadataStore* metadata, std::unique_ptr<Reachability> reachability,
                     std::unique_ptr<Membership> membership, PathRoot checkpoint_root,
                     std::string checkpoint_dir, ChannelCredentials shard_credentials);
  absl::Status Load();
  absl::Status DoRegister(const v1::RegisterServerRequest& request);
  // Assigns each chunk of `job` to the live server with the most free bytes
  // (the chunks of other jobs counted).
  absl::Status AssignServers(v1::JobInfo* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates the spec and assigns chunks; fills `job`. Marks the job as
  // being created. OK with `*existing` set when the same job exists.
  // `creator` (null without authentication) owns a new job;
  // PERMISSION_DENIED when a user other than the owner asks for an existing
  // one, NOT_FOUND when a worker asks for one that no longer exists.
  absl::Status PlanJob(const v1::JobSpec& spec, const Identity* creator, v1::JobInfo* job,
                       bool* existing);
  // Checks a restore's checkpoint against `job`'s spec and notes it in `job`;
  // returns its manifest.
  absl::StatusOr<internal::CheckpointManifest> PlanRestore(const std::string& path,
                                                           v1::JobInfo* job);
  void FinishCreate(const v1::JobInfo& job, absl::Status status);
  // The servers new copies may go to: live and not draining.
  std::vector<v1::ServerRecord> PlacementServers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job, for placement.
  std::vector<const v1::JobInfo*> PlacedJobs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::JobInfo> FindJob(const std::string& job_id) const;
  // Whether a move (MoveJob, MoveCopies) of the job is under way, or one
  // ended since its placement was `placement_version`.
  bool MovingSince(const std::string& job_id, uint64_t placement_version) const;

  // Job moves (coordinator/job_mover.cc). ServerMonitor callbacks (its
  // thread): a lost server's jobs go on from the other copies of its
  // chunks, or move when a chunk had none. A server back (or registering)
  // lists its jobs, except jobs being created or moved: it drops those that
  // have no chunk placed on it (moved off, deleted, or deleted and created
  // again while it was away), and the jobs placed on it whose chunks it
  // does not have (it restarted without them: a crash lost its memory, its
  // disk was replaced) are marked emptied. After every round of health
  // checks, the emptied jobs resume from their newest checkpoints.
  void OnServerLost(const std::string& address);
  void CheckJobsOn(const std::string& address);
  // CheckJobsOn's work on the chunks `address` listed, given the jobs'
  // placement versions taken before the listing: drops the stale jobs,
  // marks the emptied ones; a job created, moved or placed anew meanwhile
  // puts the server in recheck_ instead.
  void CheckListedJobs(const std::string& address, const v1::ListChunksResponse& listed,
                       const std::map<std::string, uint64_t>& versions) ABSL_LOCKS_EXCLUDED(mu_);
  void RecoverEmptiedJobs();
  // CheckJobsOn again for the servers in recheck_.
  void RecheckServers();
  // Takes `servers` out of emptied_[job_id]: their copies are gone from the
  // placement.
  void ForgetEmptied(const std::string& job_id, const std::set<std::string>& servers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `job_id` onto the live servers from its newest checkpoint, after
  // `why` (for the log); blocks.
  absl::Status MoveJob(const std::string& job_id, const std::string& why);
  // Takes the copies on lost servers and on `gone` out of `job_id`'s
  // placement, when every chunk keeps another copy (its first becomes the
  // primary), and has the workers re-form on it: no step is lost.
  // FAILED_PRECONDITION naming a chunk left without a copy (the job must
  // move instead).
  absl::Status DropCopies(const std::string& job_id, const std::set<std::string>& gone,
                          const std::string& why);
  // Copy moves (coordinator/copy_mover.cc), one at a time, and never with
  // DropCopies or MoveJob (moves_mu_). `plan` changes a job's copies (under
  // mu_, from the job as recorded); an error leaves them as they are.
  using PlanCopies = std::function<absl::Status(v1::JobInfo*)>;
  // Gives `job_id` the copies `plan` makes without losing a step: while
  // the job trains, each new copy's server builds it aside from a live old
  // one (SeedCopies with `prepare`); then a new generation stops its
  // workers at the end of the step under way and has them wait for the new
  // placement (StopAtStepBoundary); every server of the
  // old and new placements is fenced against older generations
  // (AllocateChunks with the new one's number), each new copy is seeded
  // from the same live old one (SeedCopies: the copies built aside replay
  // the source's last steps, the others are copied whole), the placement is
  // recorded (the old one, as a new version, when a copy failed: the
  // workers go on) and each server keeps only its copies. Adds what moved to
  // `moved` (nullable). Blocks; runs on the movers.
  // Once fenced, the old copies of a replicated job that differ from their
  // chunk's source (a step cut short: coordinator/seed_plan.h) are seeded
  // again too. With `compare_unmoved`, a replicated job whose placement
  // `plan` leaves as it is goes through the same steps, for that. A job a
  // server came back without (emptied_) is UNAVAILABLE until its copies
  // there leave the placement; a server that restarts during the move
  // refuses its allocations (ShardFleet::Absent::kRefuse), failing the move.
  // A failure leaves the copies where they were; the caller logs it.
  absl::Status MoveCopies(const std::string& job_id, const PlanCopies& plan, const std::string& why,
                          v1::CopiesMoved* moved, bool compare_unmoved = false);
  // A move's first half, while the job trains: the new copies are
  // allocated, empty and unfenced, then each new copy's server builds it
  // (SeedCopies with `prepare`: in the new copy itself where it can, else
  // aside; those it could not build are copied whole later, which is
  // logged). The allocation's error.
  absl::Status PrepareCopies(const v1::JobInfo& before, const v1::JobInfo& after,
                             std::shared_ptr<const v1::JobInfo> both, const std::string& why,
                             v1::CopiesMoved* copied);
  // Opens the generation of `after`'s placement version at a step boundary
  // and waits for the workers to stop (Membership::AwaitStepBoundary);
  // where they do not within a lease, opens another that cuts the step
  // under way. Returns the generation to fence at; counts a stop at the
  // boundary and the wait in `copied`.
  absl::StatusOr<uint64_t> StopAtStepBoundary(const std::string& job_id, const v1::JobInfo& after,
                                              v1::CopiesMoved* copied);
  // A move's second half, the workers stopped: fences every server of
  // `both` at `generation`, then seeds the new and torn copies
  // (PlanCopySeeds, SeedCopies). The first error.
  absl::Status SeedFenced(const v1::JobInfo& before, const v1::JobInfo& after,
                          std::shared_ptr<const v1::JobInfo> both, uint64_t generation,
                          v1::CopiesMoved* copied);
  // The seeds of a move, the servers fenced at `generation`: the new copies
  // of `after`, and the torn old copies, which are made anew on their
  // servers (AllocateChunks of `both` seeding them). Counts the new and
  // the torn ones in `copied`.
  absl::StatusOr<SeedPlan> PlanCopySeeds(const v1::JobInfo& before, const v1::JobInfo& after,
                                         std::shared_ptr<const v1::JobInfo> both,
                                         uint64_t generation, v1::CopiesMoved* copied);
  // Records `placed` as its job's placement; NOT_FOUND when the job went
  // meanwhile.
  absl::Status RecordPlacement(const v1::JobInfo& placed) ABSL_LOCKS_EXCLUDED(mu_);
  // After a move: each server of `both` (the placements before and after)
  // keeps its copies of `kept`, fenced at `generation`; those left without
  // a copy drop the job. Errors are ignored (a server lost meanwhile).
  void KeepPlacedCopies(const v1::JobInfo& both, const v1::JobInfo& kept, uint64_t generation);
  // Allocates `job`'s chunks on its servers, fenced at `min_generation`,
  // those `seeded` names made anew, the others absent there as `absent`
  // says (ShardFleet::Allocate), and waits for every answer; the servers
  // that allocated go to `allocated` (nullable).
  absl::Status AwaitAllocate(std::shared_ptr<const v1::JobInfo> job, uint64_t min_generation,
                             ShardFleet::Absent absent, ShardFleet::SeededChunks seeded = {},
                             std::vector<std::string>* allocated = nullptr);
  // Drops `job_id` on `addresses` and waits for their answers (errors
  // ignored: a server without the job has nothing to drop).
  void DropJobOn(const std::string& job_id, const std::vector<std::string>& addresses);
  // Has each target of `plan` seed its chunks from their source
  // (SeedChunks, one call per target and source, all at once), the servers
  // fenced; adds the copies and bytes to `copied`. With `prepare`, the job
  // trains and the copies are built aside (`copied` counts them as
  // prepared). The first error, naming the target.
  absl::Status SeedCopies(const v1::JobInfo& before, const SeedPlan& plan, bool prepare,
                          v1::CopiesMoved* copied);
  // A worker of `job_id` was lost, perhaps between its pushes to a chunk's
  // copies: a replicated job is fenced and its torn copies seeded again
  // (MoveCopies comparing an unmoved placement). On the movers.
  void CheckCopies(const std::string& job_id);
  // Which jobs RestoreReplicas() tries: all (a server was lost or
  // registered: there may be new room), or those whose last failure's
  // backoff has passed (the monitor's rounds).
  enum class RestoreWhen { kNow, kDue };
  // Gives every job whose chunks have fewer copies than its replicas more,
  // where live servers have room (after a server is lost, or registers).
  // A job it failed for (a server not reachable yet, a seed refused) is
  // tried again at the first round of health checks after its backoff
  // (`restore_retries_`). On the movers.
  void RestoreReplicas(RestoreWhen when);
  // Replaces the copy of chunk `chunk_id` of `job_id` on `address` (its
  // state diverged from the primary's) with one seeded from the primary:
  // elsewhere where a server has room, else on `address` again.
  void ReseedCopy(const std::string& job_id, uint32_t chunk_id, const std::string& address);
  // DrainServer and RebalanceJob, on the movers.
  absl::Status DoDrain(const v1::DrainServerRequest& request, v1::CopiesMoved* moved);
  absl::Status DoRebalance(const std::string& job_id, v1::CopiesMoved* moved);

  // The highest step a chunk of `job_id` on `addresses` applied (0 when
  // none answers): how far the job got, which the workers' reports
  // (membership's committed step) may lag.
  int64_t HighestAppliedStep(const std::string& job_id, const std::set<std::string>& addresses);
  // Whether MoveJob(`job_id`) is due again: it has not failed, its
  // backoff has passed, or a server registered since (monitor thread).
  bool MoveDue(const std::string& job_id);
  // Records MoveJob(`job_id`)'s result: a failure (after `why`) backs the
  // next try off and is logged when it differs from its last.
  void NoteMoveFailure(const std::string& job_id, const std::string& why,
                       const absl::Status& status);

  const std::unique_ptr<Reachability> reachability_;  // the membership's and the monitor's
  const std::unique_ptr<Membership> membership_;
  mutable absl::Mutex mu_;
  JobRegistry registry_ ABSL_GUARDED_BY(mu_);
  const Authenticator* auth_ = nullptr;
  absl::flat_hash_set<std::string> creating_ ABSL_GUARDED_BY(mu_);
  // Jobs whose chunks MoveJob is placing anew.
  absl::flat_hash_set<std::string> moving_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CollectFunction> collected_;  // ExportMetrics
  ShardFleet fleet_;
  RendezvousStore rendezvous_;
  Checkpointer checkpointer_;
  // Runs SaveCheckpoint requests, which block.
  ThreadPool checkpoint_requests_{2};
  // The jobs MoveJob failed for, and when each is tried again (monitor
  // thread only).
  RetryBackoff move_retries_{absl::Seconds(1), absl::Seconds(30)};
  // Set by a registration (new room): every job's move is due again.
  std::atomic<bool> moves_due_now_{false};
  // Jobs a server lost the chunks of, and those servers: their copies go,
  // or the jobs resume from their checkpoints.
  absl::flat_hash_map<std::string, std::set<std::string>> emptied_ ABSL_GUARDED_BY(mu_);
  // Servers whose CheckJobsOn met a job being created, moved or placed anew:
  // checked again after the next round of health checks.
  std::set<std::string> recheck_ ABSL_GUARDED_BY(mu_);
  // Held by each change of a job's copies for its whole length.
  absl::Mutex moves_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Runs copy moves (they block), one at a time. Joined (with
  // checkpoint_requests_) before any member is destroyed.
  ThreadPool movers_{1};
  // The jobs RestoreReplicas() failed for, and when each is tried again
  // (movers only).
  RetryBackoff restore_retries_{absl::Seconds(1), absl::Seconds(30)};
  // Set while a job awaits a retry of RestoreReplicas(): the monitor's
  // rounds schedule it.
  std::atomic<bool> restore_again_{false};
  // Whether the monitor counts a server lost.
  const IsLost is_lost_ = [this](const std::string& address) { return monitor_->IsLost(address); };
  // Last: stopped (joined) first.
  std::unique_ptr<ServerMonitor> monitor_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_COORDINATOR_SERVICE_H_
