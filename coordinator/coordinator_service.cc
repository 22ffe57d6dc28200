#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/fan_out.h"
#include "coordinator/job_info.h"
#include "core/chunk_bytes.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

constexpr char kServerPrefix[] = "server/";
constexpr char kJobPrefix[] = "job/";
constexpr char kKvPrefix[] = "kv/";
constexpr absl::Duration kServerCallTimeout = absl::Seconds(30);
constexpr size_t kMaxKvKeyBytes = 1024;
constexpr size_t kMaxKvValueBytes = 1 << 20;

template <typename Message>
absl::Status ParseInto(const std::string& key, const std::string& bytes, Message* message) {
  if (!message->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("coordinator metadata: cannot parse record ", key));
  }
  return absl::OkStatus();
}

absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
}

uint64_t JobBytes(const v1::ChunkSpec& chunk, v1::DType dtype) {
  return ChunkBytes(chunk.num_params(), DTypeFromProto(dtype).value_or(DType::kFp32));
}

// Bytes of chunks a server can hold: its GPU and host budgets, plus half its
// NVMe budget (a chunk on NVMe keeps two slots). An estimate; the server decides.
uint64_t Capacity(const v1::ServerRecord& server) {
  return server.gpu_budget_bytes() + server.host_budget_bytes() + server.nvme_budget_bytes() / 2;
}

}  // namespace

CoordinatorService::CoordinatorService(MetadataStore* metadata,
                                       std::unique_ptr<Membership> membership,
                                       std::string checkpoint_dir)
    : metadata_(metadata),
      membership_(std::move(membership)),
      checkpointer_([this](const std::string& address) { return StubFor(address); },
                    [this](const std::string& job_id) { return FindJob(job_id); },
                    std::move(checkpoint_dir)) {}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(
    MetadataStore* metadata, absl::Duration worker_lease, std::string checkpoint_dir,
    absl::Duration server_timeout) {
  if (server_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the server timeout must be positive");
  }
  if (checkpoint_dir.empty() || checkpoint_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory '", checkpoint_dir, "' is not an absolute path"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Membership> membership,
                   Membership::Create(metadata, worker_lease));
  std::unique_ptr<CoordinatorService> service(
      new CoordinatorService(metadata, std::move(membership), std::move(checkpoint_dir)));
  CoordinatorService* raw = service.get();
  service->monitor_ = std::make_unique<ServerMonitor>(
      std::min(absl::Seconds(1), server_timeout / 4), server_timeout,
      [raw](const std::string& address) { raw->OnServerLost(address); },
      [raw](const std::string& address) { raw->DropStaleJobs(address); });
  RETURN_IF_ERROR(service->Load());
  return service;
}

void CoordinatorService::BeginShutdown() {
  monitor_->Stop();
  membership_->Stop();
  checkpointer_.Stop();
}

absl::Status CoordinatorService::Load() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto servers, metadata_->Scan(kServerPrefix));
  for (const auto& [key, value] : servers) {
    v1::ServerRecord record;
    RETURN_IF_ERROR(ParseInto(key, value, &record));
    servers_[record.address()] = record;
    monitor_->Watch(record.address());
  }
  ASSIGN_OR_RETURN(auto jobs, metadata_->Scan(kJobPrefix));
  for (const auto& [key, value] : jobs) {
    v1::JobInfo job;
    RETURN_IF_ERROR(ParseInto(key, value, &job));
    jobs_[job.spec().job_id()] = job;
  }
  LogEventCat("coordinator", "loaded ", servers_.size(), " server(s), ", jobs_.size(),
              " job(s) from metadata");
  for (const auto& [id, job] : jobs_) checkpointer_.StartPeriodic(job);
  return absl::OkStatus();
}

v1::ShardServer::Stub* CoordinatorService::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) stub = v1::ShardServer::NewStub(MakeChannel(address));
  return stub.get();
}

absl::Status CoordinatorService::DoRegister(const v1::RegisterServerRequest& request) {
  const v1::ServerRecord& server = request.server();
  if (server.address().empty()) return absl::InvalidArgumentError("server address is empty");
  RETURN_IF_ERROR(
      metadata_->Put(absl::StrCat(kServerPrefix, server.address()), server.SerializeAsString()));
  {
    absl::MutexLock lock(&mu_);
    servers_[server.address()] = server;
  }
  monitor_->Watch(server.address());
  LogEventCat("coordinator", "shard server ", server.address(), " registered with ",
              server.gpu_budget_bytes(), " gpu, ", server.host_budget_bytes(), " host and ",
              server.nvme_budget_bytes(), " nvme budget bytes");
  DropStaleJobs(server.address());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterServer(
    grpc::CallbackServerContext* ctx, const v1::RegisterServerRequest* request,
    v1::RegisterServerResponse*) {
  return FinishUnary(ctx, DoRegister(*request));
}

absl::Status CoordinatorService::AssignServers(v1::JobInfo* job) {
  const v1::JobSpec& spec = job->spec();
  // Bytes each live server can still take: its capacity less other jobs' chunks.
  std::map<std::string, uint64_t> free, capacity;
  for (const auto& [address, server] : servers_) {
    if (!monitor_->IsLost(address)) free[address] = capacity[address] = Capacity(server);
  }
  if (free.empty()) return absl::FailedPreconditionError("no live shard servers are registered");
  for (const auto& [id, other] : jobs_) {
    if (id == spec.job_id()) continue;
    for (const auto& c : other.chunks()) {
      auto it = free.find(c.server_address());
      if (it == free.end()) continue;
      it->second -= std::min(it->second, JobBytes(c.chunk(), other.spec().dtype()));
    }
  }
  uint64_t job_bytes = 0;
  for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
    uint64_t bytes = JobBytes(a.chunk(), spec.dtype());
    job_bytes += bytes;
    // Balance by share: of the servers the chunk fits on, the one with the
    // most of its capacity free takes it, so that servers of (about) one
    // size take turns whatever their budgets' last bytes.
    auto share = [&](const auto& server) {
      return static_cast<double>(server.second) / std::max<uint64_t>(capacity[server.first], 1);
    };
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second >= bytes && (best == free.end() || share(*it) > share(*best))) best = it;
    }
    if (best == free.end()) {
      uint64_t total_free = 0;
      for (const auto& [address, bytes_free] : free) total_free += bytes_free;
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", spec.job_id(), "' does not fit: it needs ", job->flat_num_params(),
          " params, at least ", job_bytes, " bytes so far of chunks of ", bytes, " bytes; the ",
          free.size(), " live shard server(s) have ", total_free, " bytes free in all"));
    }
    best->second -= bytes;
    a.set_server_address(best->first);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorService::PlanJob(const v1::JobSpec& spec, v1::JobInfo* job,
                                         bool* existing) {
  ASSIGN_OR_RETURN(FlatLayout layout, ValidateJobSpec(spec));
  absl::MutexLock lock(&mu_);
  if (auto it = jobs_.find(spec.job_id()); it != jobs_.end()) {
    if (it->second.spec().SerializeAsString() != spec.SerializeAsString()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", spec.job_id(), "' exists with a different spec"));
    }
    *job = it->second;
    *existing = true;
    return absl::OkStatus();
  }
  if (creating_.contains(spec.job_id())) {
    return absl::UnavailableError(
        absl::StrCat("job '", spec.job_id(), "' is being created; retry"));
  }
  *job->mutable_spec() = spec;
  job->set_flat_num_params(layout.num_params());
  for (uint32_t id = 0; id < layout.num_chunks(); ++id) {
    v1::ChunkSpec* c = job->add_chunks()->mutable_chunk();
    c->set_chunk_id(id);
    c->set_flat_begin(layout.chunk_range(id).begin);
    c->set_num_params(layout.chunk_range(id).size());
  }
  RETURN_IF_ERROR(AssignServers(job));
  creating_.insert(spec.job_id());
  *existing = false;
  return absl::OkStatus();
}

void CoordinatorService::FinishCreate(const v1::JobInfo& job, absl::Status status) {
  if (status.ok()) {
    status = metadata_->Put(absl::StrCat(kJobPrefix, job.spec().job_id()), job.SerializeAsString());
  }
  absl::MutexLock lock(&mu_);
  creating_.erase(job.spec().job_id());
  if (status.ok()) {
    jobs_[job.spec().job_id()] = job;
    LogEventCat("coordinator", "job ", job.spec().job_id(), " created: ", job.flat_num_params(),
                " params in ", job.chunks_size(), " chunks, world size ", job.spec().world_size(),
                job.restored_from().empty() ? "" : ", restored from ", job.restored_from());
    checkpointer_.StartPeriodic(job);
  } else {
    LogEventCat("coordinator", "job ", job.spec().job_id(), " refused: ", status.ToString());
  }
}

absl::StatusOr<v1::CheckpointManifest> CoordinatorService::PlanRestore(const std::string& path,
                                                                       v1::JobInfo* job) {
  if (path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint path '", path, "' is not an absolute path"));
  }
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadCheckpoint(path));
  const auto& want = job->spec().tensors();
  const auto& have = manifest.spec().tensors();
  for (int i = 0, n = std::max(want.size(), have.size()); i < n; ++i) {
    if (i >= want.size() || i >= have.size() ||
        want[i].SerializeAsString() != have[i].SerializeAsString()) {
      const v1::TensorSpec& t = i < want.size() ? want[i] : have[i];
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", path, " is of another model: tensor ", i, " ('", t.name(),
          "') differs from job '", job->spec().job_id(), "''s, or is missing in one of them"));
    }
  }
  job->set_restored_from(path);
  job->set_restored_step(manifest.step());
  if (manifest.has_loss_scale()) {
    *job->mutable_restored_loss_scale() = manifest.loss_scale();
  } else {
    job->clear_restored_loss_scale();
  }
  return manifest;
}

void CoordinatorService::LoadCheckpoint(std::shared_ptr<const v1::JobInfo> job,
                                        std::shared_ptr<const v1::CheckpointManifest> manifest,
                                        std::function<void(absl::Status)> done) {
  FanOut<v1::LoadChunksResponse>(
      ServersOf(*job), kServerCallTimeout,
      [this, job, manifest](const std::string& address, grpc::ClientContext* context,
                            v1::LoadChunksResponse* out, std::function<void(grpc::Status)> done) {
        auto load = std::make_shared<v1::LoadChunksRequest>();
        load->set_job_id(job->spec().job_id());
        load->set_step(manifest->step());
        load->set_dir(job->restored_from());
        // The files whose ranges overlap the server's chunks.
        const std::vector<v1::ChunkSpec> chunks = ChunksOn(*job, address);
        for (const v1::CheckpointFile& f : manifest->files()) {
          uint64_t begin = f.chunk().flat_begin(), end = begin + f.chunk().num_params();
          if (std::any_of(chunks.begin(), chunks.end(), [&](const v1::ChunkSpec& c) {
                return begin < c.flat_begin() + c.num_params() && c.flat_begin() < end;
              })) {
            *load->add_files() = f;
          }
        }
        StubFor(address)->async()->LoadChunks(
            context, load.get(), out,
            [load, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      },
      [done = std::move(done)](auto& results) {
        absl::Status status;
        for (auto& r : results) status.Update(r->status);
        done(status);
      });
}

void CoordinatorService::DropOnServers(const std::string& job_id,
                                       const std::vector<std::string>& addresses,
                                       bool wait_for_ready,
                                       std::function<void(std::vector<std::string>)> done) {
  FanOut<v1::DropJobResponse>(
      addresses, kServerCallTimeout,
      [this, job_id, wait_for_ready](const std::string& address, grpc::ClientContext* context,
                                     v1::DropJobResponse* out,
                                     std::function<void(grpc::Status)> done) {
        context->set_wait_for_ready(wait_for_ready);
        auto drop = std::make_shared<v1::DropJobRequest>();
        drop->set_job_id(job_id);
        StubFor(address)->async()->DropJob(
            context, drop.get(), out,
            [drop, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      },
      [done = std::move(done)](auto& results) {
        std::vector<std::string> failed;
        for (auto& r : results) {
          if (!r->status.ok() && !absl::IsNotFound(r->status)) failed.push_back(r->address);
        }
        done(std::move(failed));
      });
}

void CoordinatorService::ListChunksOn(
    const std::vector<std::string>& addresses, const std::string& job_id, bool wait_for_ready,
    std::function<void(std::vector<std::unique_ptr<FanOutResult<v1::ListChunksResponse>>>&)> done) {
  FanOut<v1::ListChunksResponse>(
      addresses, kServerCallTimeout,
      [this, job_id, wait_for_ready](const std::string& address, grpc::ClientContext* context,
                                     v1::ListChunksResponse* out,
                                     std::function<void(grpc::Status)> done) {
        context->set_wait_for_ready(wait_for_ready);
        auto list = std::make_shared<v1::ListChunksRequest>();
        list->set_job_id(job_id);
        StubFor(address)->async()->ListChunks(
            context, list.get(), out,
            [list, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      },
      std::move(done));
}

grpc::ServerUnaryReactor* CoordinatorService::CreateJob(grpc::CallbackServerContext* ctx,
                                                        const v1::CreateJobRequest* request,
                                                        v1::JobInfo* response) {
  bool existing = false;
  absl::Status planned = PlanJob(request->spec(), response, &existing);
  if (!planned.ok() || existing) return FinishUnary(ctx, planned);
  std::shared_ptr<const v1::CheckpointManifest> manifest;
  if (!request->restore_from().empty()) {
    absl::StatusOr<v1::CheckpointManifest> read = PlanRestore(request->restore_from(), response);
    if (!read.ok()) {
      FinishCreate(*response, read.status());
      return FinishUnary(ctx, read.status());
    }
    manifest = std::make_shared<const v1::CheckpointManifest>(*std::move(read));
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto job = std::make_shared<const v1::JobInfo>(*response);
  // Undone on failure (before the id can be created again); a server that
  // misses the DropJob keeps reserved bytes until the id is reused.
  auto finish = [this, reactor, job](absl::Status status, std::vector<std::string> allocated) {
    auto answer = [this, reactor, job, status] {
      FinishCreate(*job, status);
      reactor->Finish(ToGrpcStatus(status));
    };
    if (status.ok()) return answer();
    DropOnServers(job->spec().job_id(), allocated, /*wait_for_ready=*/false,
                  [answer](std::vector<std::string>) { answer(); });
  };
  AllocateOnServers(
      job, /*min_generation=*/0,
      [this, job, manifest, finish](absl::Status status, std::vector<std::string> allocated) {
        if (!status.ok() || manifest == nullptr) return finish(status, allocated);
        LoadCheckpoint(job, manifest,
                       [finish, allocated](absl::Status loaded) { finish(loaded, allocated); });
      });
  return reactor;
}

void CoordinatorService::AllocateOnServers(
    std::shared_ptr<const v1::JobInfo> job, uint64_t min_generation,
    std::function<void(absl::Status, std::vector<std::string>)> done) {
  FanOut<v1::AllocateChunksResponse>(
      ServersOf(*job), kServerCallTimeout,
      [this, job, min_generation](const std::string& address, grpc::ClientContext* context,
                                  v1::AllocateChunksResponse* out,
                                  std::function<void(grpc::Status)> done) {
        auto allocate = std::make_shared<v1::AllocateChunksRequest>();
        *allocate->mutable_spec() = job->spec();
        for (const v1::ChunkSpec& c : ChunksOn(*job, address)) *allocate->add_chunks() = c;
        allocate->set_min_generation(min_generation);
        StubFor(address)->async()->AllocateChunks(
            context, allocate.get(), out,
            [allocate, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      },
      [done = std::move(done)](auto& results) {
        absl::Status status;
        std::vector<std::string> allocated;
        for (auto& r : results) {
          status.Update(r->status);
          if (r->status.ok()) allocated.push_back(r->address);
        }
        done(status, std::move(allocated));
      });
}

absl::StatusOr<v1::JobInfo> CoordinatorService::FindJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return UnknownJob(job_id);
  return it->second;
}

namespace {

// Runs `start(done)` and waits for it to call `done(status)`; the status.
absl::Status Await(const std::function<void(std::function<void(absl::Status)>)>& start) {
  absl::Notification finished;
  absl::Status out;
  start([&](absl::Status s) {
    out = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return out;
}

}  // namespace

void CoordinatorService::OnServerLost(const std::string& address) {
  std::vector<std::string> affected;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : jobs_) {
      if (HasChunksOn(job, address)) affected.push_back(id);
    }
  }
  for (const std::string& id : affected) {
    absl::Status moved = MoveJob(id);
    std::string why = moved.ok() ? "" : moved.ToString();
    if (!why.empty() && move_failures_[id] != why) {
      LogEventCat("coordinator", "job ", id, " cannot leave lost shard server ", address,
                  " yet: ", why);
    }
    move_failures_[id] = why;
  }
}

absl::Status CoordinatorService::MoveJob(const std::string& job_id) {
  const absl::Time started = absl::Now();
  ASSIGN_OR_RETURN(const v1::JobInfo job, FindJob(job_id));
  const std::string dir = checkpointer_.DirFor(job.spec(), "");
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints,
                   strata::ListCheckpoints(dir, job_id));
  if (checkpoints.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it has no checkpoint in ", dir, " to resume from; it waits for the server to return"));
  }
  auto moved = std::make_shared<v1::JobInfo>(job);
  moved->set_placement_version(job.placement_version() + 1);
  ASSIGN_OR_RETURN(v1::CheckpointManifest read,
                   PlanRestore(checkpoints.back().path(), moved.get()));
  auto manifest = std::make_shared<const v1::CheckpointManifest>(std::move(read));
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AssignServers(moved.get()));
    moving_.insert(job_id);
  }
  absl::Cleanup moved_or_not = [&] {
    absl::MutexLock lock(&mu_);
    moving_.erase(job_id);
  };
  v1::JobSummary before;
  membership_->Summarize(job_id, &before);
  // The workers stop the step they run, and wait for the new placement.
  ASSIGN_OR_RETURN(uint64_t generation,
                   membership_->ChunksMoved(job_id, moved->placement_version(), manifest->step()));
  checkpointer_.CancelSaves(job_id);
  // Every chunk starts again from the checkpoint: drop the job first on
  // every live server that holds it or will.
  std::set<std::string> stale, lost;
  auto add = [&](const v1::JobInfo& placement) {
    for (std::string& address : ServersOf(placement)) {
      if (monitor_->IsLost(address)) {
        lost.insert(std::move(address));
      } else {
        stale.insert(std::move(address));
      }
    }
  };
  add(job);
  add(*moved);
  auto drop = [&](const std::vector<std::string>& addresses) {
    Await([&](auto done) {
      DropOnServers(job_id, addresses, /*wait_for_ready=*/false,
                    [done](std::vector<std::string>) { done(absl::OkStatus()); });
    }).IgnoreError();
  };
  drop({stale.begin(), stale.end()});
  std::vector<std::string> allocated;
  absl::Status status = Await([&](auto done) {
    AllocateOnServers(moved, generation,
                      [&allocated, done](absl::Status s, std::vector<std::string> servers) {
                        allocated = std::move(servers);
                        done(std::move(s));
                      });
  });
  if (status.ok()) status = Await([&](auto done) { LoadCheckpoint(moved, manifest, done); });
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    if (jobs_.count(job_id) == 0) {
      status = absl::NotFoundError(absl::StrCat("job '", job_id, "' was deleted during the move"));
      // The move opened a generation for it again.
      membership_->Forget(job_id).IgnoreError();
    } else {
      status = metadata_->Put(absl::StrCat(kJobPrefix, job_id), moved->SerializeAsString());
      if (status.ok()) jobs_[job_id] = *moved;
    }
  }
  if (!status.ok()) {
    drop(allocated);
    return status;
  }
  // A lost server that registered again during the move kept the job's
  // chunks (its DropStaleJobs skipped the moving job): drop them now.
  std::vector<std::string> returned;
  for (const std::string& address : lost) {
    if (!monitor_->IsLost(address) && !HasChunksOn(*moved, address)) returned.push_back(address);
  }
  if (!returned.empty()) {
    DropOnServers(job_id, returned, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
  }
  LogEventCat("coordinator", "job ", job_id, ": chunks moved to ", ServersOf(*moved).size(),
              " live shard server(s) in ", absl::FormatDuration(absl::Now() - started),
              "; it resumes from checkpoint ", moved->restored_from(), " (step ", manifest->step(),
              ", ", std::max<int64_t>(before.committed_step() - manifest->step(), 0),
              " step(s) after it are lost)");
  return absl::OkStatus();
}

void CoordinatorService::DropStaleJobs(const std::string& address) {
  ListChunksOn({address}, /*job_id=*/"", /*wait_for_ready=*/true, [this](auto& results) {
    const auto& listed = *results.front();
    if (!listed.status.ok()) return;
    // Job id -> why the server must not keep it.
    std::map<std::string, std::string> stale;
    {
      absl::MutexLock lock(&mu_);
      for (const v1::ChunkStatus& c : listed.response.chunks()) {
        const std::string& id = c.job_id();
        // A creation or a move places chunks before it commits; both
        // drop what they placed if they fail.
        if (creating_.contains(id) || moving_.contains(id)) continue;
        auto job = jobs_.find(id);
        if (job == jobs_.end()) {
          stale[id] = "it is not a job of this coordinator (deleted while the server was away)";
        } else if (!HasChunksOn(job->second, listed.address)) {
          stale[id] =
              "none of its chunks is placed there (they moved off, or the job was deleted and "
              "created again while the server was away)";
        }
      }
    }
    for (const auto& [id, why] : stale) {
      LogEventCat("coordinator", "job ", id, " on shard server ", listed.address, ": ", why,
                  "; dropping it there");
      DropOnServers(id, {listed.address}, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
    }
  });
}

grpc::ServerUnaryReactor* CoordinatorService::DeleteJob(grpc::CallbackServerContext* ctx,
                                                        const v1::DeleteJobRequest* request,
                                                        v1::DeleteJobResponse* response) {
  const std::string& job_id = request->job_id();
  if (job_id.empty()) return FinishUnary(ctx, absl::InvalidArgumentError("job id is empty"));
  v1::JobInfo job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return FinishUnary(ctx, creating_.contains(job_id)
                                  ? absl::FailedPreconditionError(absl::StrCat(
                                        "job '", job_id, "' is being created; try again after it"))
                                  : UnknownJob(job_id));
    }
    // Under mu_, which JoinJob holds too: no worker joins in between.
    absl::Status forgotten = membership_->Forget(job_id);
    if (forgotten.ok()) forgotten = metadata_->Delete(absl::StrCat(kJobPrefix, job_id));
    if (!forgotten.ok()) return FinishUnary(ctx, forgotten);
    job = std::move(it->second);
    jobs_.erase(it);
  }
  checkpointer_.CancelSaves(job_id);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  DropOnServers(job_id, ServersOf(job), /*wait_for_ready=*/false,
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
  for (const auto& [id, job] : jobs_) {
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
      num_servers = servers_.size();
      num_jobs = jobs_.size();
      for (const auto& [id, job] : jobs_) {
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
    auto it = jobs_.find(request->job_id());
    joined = it == jobs_.end() ? UnknownJob(request->job_id())
                               : membership_->Join(it->second.spec(), *request);
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

namespace {

// Streams a job's generations to one watcher: the current one if newer than
// what the client knows, then each new one. One write in flight; a newer
// generation that arrives meanwhile replaces the pending one.
class GenerationStream : public grpc::ServerWriteReactor<v1::Generation>,
                         public Membership::Watcher {
 public:
  GenerationStream(Membership* membership, std::string job_id, uint64_t known)
      : membership_(membership), job_id_(std::move(job_id)), sent_(known) {
    OnGeneration(membership_->Subscribe(job_id_, this));
  }

  void OnGeneration(const v1::Generation& generation) override {
    absl::MutexLock lock(&mu_);
    if (generation.number() <= sent_ || closing_) return;
    pending_ = generation;
    has_pending_ = true;
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok || closing_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "generation stream closed"));
    } else if (has_pending_) {
      WriteNextLocked();
    }
  }

  void OnStop() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::OK);
  }

  void OnDone() override {
    membership_->Unsubscribe(job_id_, this);
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    has_pending_ = false;
    current_ = pending_;
    sent_ = current_.number();
    StartWrite(&current_);
  }
  // Finishes now, or once the write in flight is done.
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    closing_ = true;
    if (writing_ || finished_) return;
    finished_ = true;
    Finish(status);
  }

  Membership* const membership_;
  const std::string job_id_;
  absl::Mutex mu_;
  uint64_t sent_ ABSL_GUARDED_BY(mu_);
  v1::Generation pending_ ABSL_GUARDED_BY(mu_), current_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A stream refused before it started.
template <typename Message>
class FailedStream : public grpc::ServerWriteReactor<Message> {
 public:
  explicit FailedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::Generation>* CoordinatorService::WatchGeneration(
    grpc::CallbackServerContext*, const v1::WatchGenerationRequest* request) {
  if (absl::Status found = FindJob(request->job_id()).status(); !found.ok()) {
    return new FailedStream<v1::Generation>(found);
  }
  return new GenerationStream(membership_.get(), request->job_id(), request->known_generation());
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
      auto it = servers_.find(address);
      if (it != servers_.end()) *response->add_servers() = it->second;
    }
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ListChunksOn(
      ServersOf(*job), job->spec().job_id(), /*wait_for_ready=*/false,
      [reactor, response, job, layout = *std::move(layout)](auto& results) {
        // (address, chunk id) -> what that server reports.
        std::map<std::pair<std::string, uint32_t>, const v1::ChunkStatus*> reported;
        for (auto& r : results) {
          for (const auto& c : r->response.chunks()) {
            reported[{r->address, c.chunk().chunk_id()}] = &c;
          }
        }
        for (const auto& a : job->chunks()) {
          v1::PlacementRow* row = response->add_rows();
          row->set_job_id(job->spec().job_id());
          row->set_chunk_id(a.chunk().chunk_id());
          row->set_flat_begin(a.chunk().flat_begin());
          row->set_num_params(a.chunk().num_params());
          for (const std::string& name : layout.TensorsIn(
                   {a.chunk().flat_begin(), a.chunk().flat_begin() + a.chunk().num_params()})) {
            row->add_tensors(name);
          }
          row->set_server_address(a.server_address());
          auto it = reported.find({a.server_address(), a.chunk().chunk_id()});
          if (it == reported.end()) {
            row->set_tier("missing");
            row->set_applied_step(-1);
          } else {
            row->set_tier(it->second->tier());
            row->set_num_bytes(it->second->num_bytes());
            row->set_applied_step(it->second->applied_step());
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
    absl::StatusOr<v1::CheckpointInfo> saved =
        checkpointer_.Save(job, checkpointer_.DirFor(job.spec(), request->dir()));
    if (saved.ok()) *response = *std::move(saved);
    reactor->Finish(ToGrpcStatus(saved.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  if (!IsValidId(request->job_id())) {
    return FinishUnary(
        ctx, absl::InvalidArgumentError(absl::StrCat("invalid job id '", request->job_id(), "'")));
  }
  // A job this coordinator does not know may have checkpoints to restore.
  absl::StatusOr<v1::JobInfo> job = FindJob(request->job_id());
  v1::JobSpec spec = job.ok() ? job->spec() : v1::JobSpec();
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed =
      strata::ListCheckpoints(checkpointer_.DirFor(spec, request->dir()), request->job_id());
  if (listed.ok()) {
    for (auto& c : *listed) *response->add_checkpoints() = std::move(c);
  }
  return FinishUnary(ctx, listed.status());
}

grpc::ServerUnaryReactor* CoordinatorService::KvSet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvSetRequest* request,
                                                    v1::KvSetResponse*) {
  if (request->key().empty() || request->key().size() > kMaxKvKeyBytes) {
    return FinishUnary(ctx, absl::InvalidArgumentError(
                                absl::StrCat("key must have 1 to ", kMaxKvKeyBytes, " bytes")));
  }
  if (request->value().size() > kMaxKvValueBytes) {
    return FinishUnary(ctx, absl::InvalidArgumentError(
                                absl::StrCat("value of ", request->value().size(),
                                             " bytes exceeds the maximum of ", kMaxKvValueBytes)));
  }
  return FinishUnary(ctx,
                     metadata_->Put(absl::StrCat(kKvPrefix, request->key()), request->value()));
}

grpc::ServerUnaryReactor* CoordinatorService::KvGet(grpc::CallbackServerContext* ctx,
                                                    const v1::KvGetRequest* request,
                                                    v1::KvGetResponse* response) {
  absl::StatusOr<std::optional<std::string>> value =
      metadata_->Get(absl::StrCat(kKvPrefix, request->key()));
  if (!value.ok()) return FinishUnary(ctx, value.status());
  if (!value->has_value()) {
    return FinishUnary(ctx, absl::NotFoundError(absl::StrCat("no key '", request->key(), "'")));
  }
  response->set_value(**value);
  return FinishUnary(ctx, absl::OkStatus());
}

}  // namespace strata
