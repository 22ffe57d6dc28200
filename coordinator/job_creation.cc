// CoordinatorService's job creation: CreateJob plans the job (spec, owner,
// worker token, chunks and their servers), optionally from a checkpoint,
// allocates its chunks on the fleet and loads the checkpoint, and records
// the job once every server has it.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_info.h"
#include "coordinator/placement.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/token.h"
#include "strata/internal/records.pb.h"

namespace strata {

absl::Status CoordinatorService::AssignServers(v1::JobInfo* job) {
  return PlaceChunks(PlacementServers(), PlacedJobs(), job);
}

absl::Status CoordinatorService::PlanJob(const v1::JobSpec& spec, const Identity* creator,
                                         v1::JobInfo* job, bool* existing) {
  ASSIGN_OR_RETURN(FlatLayout layout, ValidateJobSpec(spec));
  RETURN_IF_ERROR(checkpointer_.DirFor(spec, "").status());
  std::string worker_token;
  if (creator != nullptr) {
    ASSIGN_OR_RETURN(worker_token, NewToken());
  }
  absl::MutexLock lock(&mu_);
  if (const v1::JobInfo* known = registry_.FindJob(spec.job_id()); known != nullptr) {
    if (creator != nullptr && creator->role == Role::kUser && known->owner() != creator->name) {
      return absl::PermissionDeniedError(
          absl::StrCat(Describe(*creator), " does not own job '", spec.job_id(), "'"));
    }
    if (known->spec().SerializeAsString() != spec.SerializeAsString()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", spec.job_id(), "' exists with a different spec"));
    }
    *job = *known;
    *existing = true;
    return absl::OkStatus();
  }
  if (creating_.contains(spec.job_id())) {
    return absl::UnavailableError(
        absl::StrCat("job '", spec.job_id(), "' is being created; retry"));
  }
  if (creator != nullptr && creator->role == Role::kWorker) {
    return UnknownJob(spec.job_id());  // deleted since its token was checked
  }
  *job->mutable_spec() = spec;
  if (creator != nullptr) {
    job->set_owner(creator->name);
    job->set_worker_token(std::move(worker_token));
  }
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
  absl::MutexLock lock(&mu_);
  creating_.erase(job.spec().job_id());
  if (status.ok()) status = registry_.PutJob(job);
  if (status.ok()) {
    LogEventCat("coordinator", "job ", job.spec().job_id(), " created: ", job.flat_num_params(),
                " params in ", job.chunks_size(), " chunks, world size ", job.spec().world_size(),
                job.restored_from().empty() ? "" : ", restored from ", job.restored_from());
    checkpointer_.StartPeriodic(job);
  } else {
    LogEventCat("coordinator", "job ", job.spec().job_id(), " refused: ", status.ToString());
  }
}

absl::StatusOr<internal::CheckpointManifest> CoordinatorService::PlanRestore(
    const std::string& requested_path, v1::JobInfo* job) {
  ASSIGN_OR_RETURN(const std::string path,
                   checkpointer_.root().Resolve(requested_path, "restore_from"));
  ASSIGN_OR_RETURN(internal::CheckpointManifest manifest,
                   ReadCheckpoint(checkpointer_.root(), path));
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

grpc::ServerUnaryReactor* CoordinatorService::CreateJob(grpc::CallbackServerContext* ctx,
                                                        const v1::CreateJobRequest* request,
                                                        v1::JobInfo* response) {
  std::optional<Identity> creator;
  if (auth_ != nullptr) {
    absl::StatusOr<Identity> who = auth_->Identify(*ctx);
    if (!who.ok()) return FinishUnary(ctx, who.status());
    creator = *std::move(who);
  }
  bool existing = false;
  absl::Status planned =
      PlanJob(request->spec(), creator.has_value() ? &*creator : nullptr, response, &existing);
  if (!planned.ok() || existing) return FinishUnary(ctx, planned);
  std::shared_ptr<const internal::CheckpointManifest> manifest;
  if (!request->restore_from().empty()) {
    absl::StatusOr<internal::CheckpointManifest> read =
        PlanRestore(request->restore_from(), response);
    if (!read.ok()) {
      FinishCreate(*response, read.status());
      return FinishUnary(ctx, read.status());
    }
    manifest = std::make_shared<const internal::CheckpointManifest>(*std::move(read));
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
    fleet_.Drop(job->spec().job_id(), allocated, /*wait_for_ready=*/false,
                [answer](std::vector<std::string>) { answer(); });
  };
  fleet_.Allocate(
      job, /*min_generation=*/0,
      manifest == nullptr ? ShardFleet::Absent::kMakeAnew : ShardFleet::Absent::kMakeAnewToLoad,
      [this, job, manifest, finish](absl::Status status, std::vector<std::string> allocated) {
        if (!status.ok() || manifest == nullptr) return finish(status, allocated);
        fleet_.Load(job, manifest,
                    [finish, allocated](absl::Status loaded) { finish(loaded, allocated); });
      });
  return reactor;
}

}  // namespace strata
