#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/generation_stream.h"
#include "coordinator/job_info.h"
#include "coordinator/server_record.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"
#include "rpc/token.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

constexpr absl::Duration kServerCallTimeout = absl::Seconds(30);

}  // namespace

CoordinatorService::CoordinatorService(MetadataStore* metadata,
                                       std::unique_ptr<Reachability> reachability,
                                       std::unique_ptr<Membership> membership,
                                       PathRoot checkpoint_root, std::string checkpoint_dir,
                                       ChannelCredentials shard_credentials)
    : reachability_(std::move(reachability)),
      membership_(std::move(membership)),
      registry_(metadata),
      fleet_(kServerCallTimeout, std::move(shard_credentials)),
      rendezvous_(metadata),
      checkpointer_(
          [this](const std::string& address) { return fleet_.Stub(address); },
          [this](const std::string& job_id) { return FindJob(job_id); },
          [this](const std::string& job_id, uint32_t chunk_id, const std::string& address) {
            movers_.Schedule(
                [this, job_id, chunk_id, address] { ReseedCopy(job_id, chunk_id, address); });
          },
          std::move(checkpoint_root), std::move(checkpoint_dir)) {}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    MetadataStore* metadata, absl::Duration worker_lease, std::string checkpoint_dir,
    const std::string& checkpoint_root, absl::Duration server_timeout,
    ChannelCredentials shard_credentials) {
  if (server_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the server timeout must be positive");
  }
  ASSIGN_OR_RETURN(PathRoot root,
                   PathRoot::Open(checkpoint_root.empty() ? checkpoint_dir : checkpoint_root,
                                  "checkpoint_root"));
  ASSIGN_OR_RETURN(checkpoint_dir, root.Resolve(checkpoint_dir, "--checkpoint_dir"));
  auto reachability = std::make_unique<Reachability>();
  ASSIGN_OR_RETURN(std::unique_ptr<Membership> membership,
                   Membership::Create(metadata, worker_lease, reachability.get()));
  std::unique_ptr<CoordinatorService> service(
      new CoordinatorService(metadata, std::move(reachability), std::move(membership),
                             std::move(root), std::move(checkpoint_dir), shard_credentials));
  CoordinatorService* raw = service.get();
  service->monitor_ = std::make_unique<ServerMonitor>(
      std::min(absl::Seconds(1), server_timeout / 4), server_timeout, shard_credentials,
      service->reachability_.get(),
      [raw](const std::string& address) { raw->OnServerLost(address); },
      [raw](const std::string& address) {
        raw->moves_due_now_ = true;  // it may be lost again: a first try then
        raw->CheckJobsOn(address);
      },
      [raw] {
        raw->RecheckServers();
        raw->RecoverEmptiedJobs();
        if (raw->restore_again_.exchange(false)) {
          raw->movers_.Schedule([raw] { raw->RestoreReplicas(RestoreWhen::kDue); });
        }
      });
  raw->membership_->SetOnMemberLost([raw](const std::string& job_id) {
    raw->movers_.Schedule([raw, job_id] { raw->CheckCopies(job_id); });
  });
  RETURN_IF_ERROR(service->Load());
  return service;
}

CoordinatorService::~CoordinatorService() {
  // The lease thread, the monitor and the checkpoints schedule moves; the
  // moves (and the checkpoint requests, which may schedule reseeds) use
  // every member, so they end before any member is destroyed.
  BeginShutdown();
  checkpoint_requests_.Join();
  movers_.Join();
}

void CoordinatorService::BeginShutdown() {
  monitor_->Stop();
  membership_->Stop();
  checkpointer_.Stop();
}

absl::Status CoordinatorService::Load() {
  RETURN_IF_ERROR(rendezvous_.Load());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(registry_.Load());
  // A move the previous process announced (its generation carries the new
  // placement version) but did not record: its workers wait for that
  // version. The copies stay where they were, as after a failed move
  // (servers drop the new ones when they register: CheckJobsOn).
  std::vector<v1::JobInfo> cut;
  for (const auto& [id, job] : registry_.jobs()) {
    const uint64_t announced = membership_->PlacementVersion(id);
    if (announced <= job.placement_version()) continue;
    cut.push_back(job);
    cut.back().set_placement_version(announced);
  }
  for (const v1::JobInfo& job : cut) {
    LogEventCat("coordinator", "job ", job.spec().job_id(), ": the move to placement ",
                job.placement_version(),
                " did not finish before the restart; its copies stay where they were");
    RETURN_IF_ERROR(registry_.PutJob(job));
  }
  for (const auto& [address, server] : registry_.servers()) monitor_->Watch(address);
  LogEventCat("coordinator", "loaded ", registry_.servers().size(), " server(s), ",
              registry_.jobs().size(), " job(s) from metadata");
  for (const auto& [id, job] : registry_.jobs()) checkpointer_.StartPeriodic(job);
  return absl::OkStatus();
}

absl::Status CoordinatorService::DoRegister(const v1::RegisterServerRequest& request) {
  const v1::ServerRecord& server = request.server();
  RETURN_IF_ERROR(ValidateServerRecord(server));
  v1::ServerRecord record = server;
  {
    absl::MutexLock lock(&mu_);
    // A draining server stays draining (DrainServer alone changes that).
    const v1::ServerRecord* known = registry_.FindServer(server.address());
    record.set_draining(known != nullptr && known->draining());
    RETURN_IF_ERROR(registry_.PutServer(record));
  }
  monitor_->Watch(server.address());
  fleet_.Reconnect(server.address());
  LogEventCat("coordinator", "shard server ", server.address(), " registered with ",
              server.gpu_budget_bytes(), " gpu, ", server.host_budget_bytes(), " host and ",
              server.nvme_budget_bytes(), " nvme budget bytes",
              record.draining() ? " (draining: it takes no chunks)" : "");
  CheckJobsOn(server.address());
  // Jobs that could not move may move here.
  moves_due_now_ = true;
  // Jobs short of copies may have them here.
  movers_.Schedule([this] { RestoreReplicas(RestoreWhen::kNow); });
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterServer(
    grpc::CallbackServerContext* ctx, const v1::RegisterServerRequest* request,
    v1::RegisterServerResponse*) {
  return FinishUnary(ctx, DoRegister(*request));
}

std::optional<std::string> CoordinatorService::JobOfToken(absl::string_view digest) const {
  absl::MutexLock lock(&mu_);
  return registry_.JobOfToken(digest);
}

std::optional<std::string> CoordinatorService::OwnerOf(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  const v1::JobInfo* job = registry_.FindJob(std::string(job_id));
  if (job == nullptr) return std::nullopt;
  return job->owner();
}

absl::StatusOr<v1::JobInfo> CoordinatorService::FindJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const v1::JobInfo* job = registry_.FindJob(job_id);
  if (job == nullptr) return UnknownJob(job_id);
  return *job;
}

bool CoordinatorService::MovingSince(const std::string& job_id, uint64_t placement_version) const {
  absl::MutexLock lock(&mu_);
  const v1::JobInfo* job = registry_.FindJob(job_id);
  return moving_.contains(job_id) ||
         (job != nullptr && job->placement_version() != placement_version);
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                        const v1::DeleteJobRequest* request,
                                                        v1::DeleteJobResponse* response) {
  const std::string& job_id = request->job_id();
  if (job_id.empty()) return FinishUnary(ctx, absl::InvalidArgumentError("job id is empty"));
  v1::JobInfo job;
  {
    absl::MutexLock lock(&mu_);
    const v1::JobInfo* known = registry_.FindJob(job_id);
    if (known == nullptr) {
      return FinishUnary(ctx, creating_.contains(job_id)
                                  ? absl::FailedPreconditionError(absl::StrCat(
                                        "job '", job_id, "' is being created; try again after it"))
                                  : UnknownJob(job_id));
    }
    // A move in flight allocates the job on servers again: it ends first
    // (its calls are bounded), then the job can go.
    if (moving_.contains(job_id)) {
      return FinishUnary(ctx, absl::FailedPreconditionError(absl::StrCat(
                                  "job '", job_id, "' is moving its chunks; try again after it")));
    }
    // Under mu_, which JoinJob holds too: no worker joins in between.
    // Its rendezvous keys go first: a store error leaves the job, which a
    // retry deletes.
    job = *known;
    absl::Status forgotten = membership_->Forget(job_id);
    if (forgotten.ok()) forgotten = rendezvous_.DeleteJob(job_id);
    if (forgotten.ok()) forgotten = registry_.DeleteJob(job_id);
    if (!forgotten.ok()) return FinishUnary(ctx, forgotten);
  }
  checkpointer_.CancelSaves(job_id);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  fleet_.Drop(job_id, ServersOf(job), /*wait_for_ready=*/false,
              [reactor, response, job_id](std::vector<std::string> failed) {
                LogEventCat("coordinator", "job ", job_id, " deleted",
                            failed.empty() ? "" : "; not dropped yet on ",
                            absl::StrJoin(failed, ", "));
                for (std::string& address : failed) {
                  response->add_unreachable_servers(std::move(address));
                }
                reactor->Finish(grpc::Status::OK);
              });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* ctx,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobInfo* response) {
  absl::StatusOr<v1::JobInfo> job = FindJob(request->job_id());
  if (job.ok()) *response = *std::move(job);
  return FinishUnary(ctx, job.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* ctx,
                                                       const v1::ListJobsRequest*,
                                                       v1::ListJobsResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, job] : registry_.jobs()) {
    v1::JobSummary* summary = response->add_jobs();
    *summary->mutable_job() = job;
    membership_->Summarize(id, summary);
    summary->set_samples_consumed(static_cast<uint64_t>(summary->committed_step()) *
                                  job.spec().samples_per_step());
  }
  return FinishUnary(ctx, absl::OkStatus());
}

void CoordinatorService::ExportMetrics(Metrics* metrics) {
  collected_ = std::make_shared<CollectFunction>([this] {
    std::vector<std::pair<prometheus::Labels, double>> members, generation, step;
    double num_servers, num_jobs;
    {
      absl::MutexLock lock(&mu_);
      num_servers = registry_.servers().size();
      num_jobs = registry_.jobs().size();
      for (const auto& [id, job] : registry_.jobs()) {
        v1::JobSummary summary;
        membership_->Summarize(id, &summary);
        members.push_back({{{"job", id}}, static_cast<double>(summary.num_members())});
        generation.push_back({{{"job", id}}, static_cast<double>(summary.generation())});
        step.push_back({{{"job", id}}, static_cast<double>(summary.committed_step())});
      }
    }
    using prometheus::MetricType;
    return std::vector<prometheus::MetricFamily>{
        ValueFamily(MetricType::Gauge, "strata_servers", "Registered shard servers",
                    {{{}, num_servers}}),
        ValueFamily(MetricType::Gauge, "strata_jobs", "Jobs", {{{}, num_jobs}}),
        ValueFamily(MetricType::Gauge, "strata_job_members", "Workers that are members of a job",
                    members),
        ValueFamily(MetricType::Gauge, "strata_job_generation", "A job's current generation",
                    generation),
        ValueFamily(MetricType::Gauge, "strata_job_committed_step",
                    "The last step a member of the job reported complete", step)};
  });
  metrics->Register(collected_);
}

grpc::ServerUnaryReactor* CoordinatorService::JoinJob(grpc::CallbackServerContext* ctx,
                                                      const v1::JoinJobRequest* request,
                                                      v1::JoinJobResponse* response) {
  absl::StatusOr<v1::JoinJobResponse> joined;
  {
    // Under mu_, which DeleteJob holds too: a deleted job gets no member.
    absl::MutexLock lock(&mu_);
    const v1::JobInfo* job = registry_.FindJob(request->job_id());
    joined =
        job == nullptr ? UnknownJob(request->job_id()) : membership_->Join(job->spec(), *request);
  }
  if (joined.ok()) *response = *std::move(joined);
  return FinishUnary(ctx, joined.status());
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  absl::StatusOr<uint64_t> generation = membership_->Heartbeat(*request);
  if (generation.ok()) response->set_generation(*generation);
  return FinishUnary(ctx, generation.status());
}

grpc::ServerUnaryReactor* CoordinatorService::LeaveJob(grpc::CallbackServerContext* ctx,
                                                       const v1::LeaveJobRequest* request,
                                                       v1::LeaveJobResponse* response) {
  absl::StatusOr<v1::Generation> generation = membership_->Leave(*request);
  if (generation.ok()) *response->mutable_generation() = *std::move(generation);
  return FinishUnary(ctx, generation.status());
}

grpc::ServerUnaryReactor* CoordinatorService::RenewGeneration(
    grpc::CallbackServerContext* ctx, const v1::RenewGenerationRequest* request,
    v1::RenewGenerationResponse* response) {
  absl::StatusOr<v1::Generation> generation = membership_->Renew(*request);
  if (generation.ok()) *response->mutable_generation() = *std::move(generation);
  return FinishUnary(ctx, generation.status());
}

grpc::ServerWriteReactor<v1::Generation>* CoordinatorService::WatchGeneration(
    grpc::CallbackServerContext*, const v1::WatchGenerationRequest* request) {
  if (absl::Status found = FindJob(request->job_id()).status(); !found.ok()) {
    return RefusedGenerationStream(found);
  }
  return NewGenerationStream(membership_.get(), request->job_id(), request->known_generation(),
                             request->worker_id());
}

grpc::ServerUnaryReactor* CoordinatorService::ListMembers(grpc::CallbackServerContext* ctx,
                                                          const v1::ListMembersRequest* request,
                                                          v1::ListMembersResponse* response) {
  absl::Status found = FindJob(request->job_id()).status();
  if (found.ok()) membership_->ListMembers(request->job_id(), response);
  return FinishUnary(ctx, found);
}

grpc::ServerUnaryReactor* CoordinatorService::GetPlacement(grpc::CallbackServerContext* ctx,
                                                           const v1::GetPlacementRequest* request,
                                                           v1::GetPlacementResponse* response) {
  absl::StatusOr<v1::JobInfo> found = FindJob(request->job_id());
  if (!found.ok()) return FinishUnary(ctx, found.status());
  auto job = std::make_shared<v1::JobInfo>(*std::move(found));
  absl::StatusOr<FlatLayout> layout =
      FlatLayout::Create(TensorsFromProto(job->spec()), job->spec().chunk_num_params());
  if (!layout.ok()) return FinishUnary(ctx, layout.status());
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& address : ServersOf(*job)) {
      const v1::ServerRecord* server = registry_.FindServer(address);
      if (server != nullptr) *response->add_servers() = *server;
    }
  }
  const bool moving_before = MovingSince(job->spec().job_id(), job->placement_version());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  fleet_.ListChunks(
      ServersOf(*job), job->spec().job_id(), /*wait_for_ready=*/false,
      [this, reactor, response, job, moving_before, layout = *std::move(layout)](auto& results) {
        // A move under way at any time while the servers were asked may
        // have left any mix of steps on them.
        response->set_moving(moving_before ||
                             MovingSince(job->spec().job_id(), job->placement_version()));
        // (address, chunk id) -> what that server reports.
        std::map<std::pair<std::string, uint32_t>, const v1::ChunkStatus*> reported;
        for (auto& r : results) {
          for (const auto& c : r->response.chunks()) {
            reported[{r->address, c.chunk().chunk_id()}] = &c;
          }
        }
        for (const auto& a : job->chunks()) {
          const std::vector<std::string> copies = CopiesOf(a);
          for (uint32_t copy = 0; copy < copies.size(); ++copy) {
            v1::PlacementRow* row = response->add_rows();
            row->set_job_id(job->spec().job_id());
            row->set_chunk_id(a.chunk().chunk_id());
            row->set_flat_begin(a.chunk().flat_begin());
            row->set_num_params(a.chunk().num_params());
            for (const std::string& name : layout.TensorsIn(
                     {a.chunk().flat_begin(), a.chunk().flat_begin() + a.chunk().num_params()})) {
              row->add_tensors(name);
            }
            row->set_server_address(copies[copy]);
            row->set_copy(copy);
            auto it = reported.find({copies[copy], a.chunk().chunk_id()});
            if (it == reported.end()) {
              row->set_tier("missing");
              row->set_applied_step(-1);
            } else {
              row->set_tier(it->second->tier());
              row->set_num_bytes(it->second->num_bytes());
              row->set_applied_step(it->second->applied_step());
            }
          }
        }
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::SaveCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::SaveCheckpointRequest* request,
    v1::CheckpointInfo* response) {
  absl::StatusOr<v1::JobInfo> job = FindJob(request->job_id());
  if (!job.ok()) return FinishUnary(ctx, job.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoint_requests_.Schedule([this, reactor, request, response, job = *std::move(job)] {
    absl::StatusOr<std::string> dir = checkpointer_.DirFor(job.spec(), request->dir());
    absl::StatusOr<v1::CheckpointInfo> saved =
        dir.ok() ? checkpointer_.Save(job, *dir) : dir.status();
    if (saved.ok()) *response = *std::move(saved);
    reactor->Finish(ToGrpcStatus(saved.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  if (!IsValidId(request->job_id())) {
    return FinishUnary(ctx, absl::InvalidArgumentError(
                                absl::StrCat("invalid job id ", Quoted(request->job_id()))));
  }
  // A job this coordinator does not know may have checkpoints to restore.
  absl::StatusOr<v1::JobInfo> job = FindJob(request->job_id());
  v1::JobSpec spec = job.ok() ? job->spec() : v1::JobSpec();
  absl::StatusOr<std::string> dir = checkpointer_.DirFor(spec, request->dir());
  if (!dir.ok()) return FinishUnary(ctx, dir.status());
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed =
      strata::ListCheckpoints(checkpointer_.root(), *dir, request->job_id());
  if (listed.ok()) {
    for (auto& c : *listed) *response->add_checkpoints() = std::move(c);
  }
  return FinishUnary(ctx, listed.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KvSet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvSetRequest* request,
                                                    v1::KvSetResponse*) {
  return FinishUnary(ctx, rendezvous_.Set(request->key(), request->value()));
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvGetRequest* request,
                                                    v1::KvGetResponse* response) {
  absl::StatusOr<std::string> value = rendezvous_.Get(request->key());
  if (value.ok()) response->set_value(*std::move(value));
  return FinishUnary(ctx, value.status());
}

}  // namespace strata
