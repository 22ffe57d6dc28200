#include "coordinator/checkpointer.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/fan_out.h"
#include "coordinator/job_info.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

constexpr absl::Duration kListTimeout = absl::Seconds(30);
// Time for the servers to write their chunks, on top of the wait for the step.
constexpr absl::Duration kWriteTimeout = absl::Minutes(30);
// A periodic save waits this long for its step before it arms again.
constexpr absl::Duration kPeriodicWait = absl::Minutes(10);
constexpr int kMaxStepChoices = 5;

}  // namespace

Checkpointer::Checkpointer(StubFor stub_for, JobFor job_for, OnDivergent on_divergent,
                           PathRoot root, std::string default_dir)
    : stub_for_(std::move(stub_for)),
      job_for_(std::move(job_for)),
      on_divergent_(std::move(on_divergent)),
      root_(std::move(root)),
      default_dir_(std::move(default_dir)) {}

Checkpointer::~Checkpointer() { Stop(); }

absl::StatusOr<std::string> Checkpointer::DirFor(const v1::JobSpec& spec,
                                                 const std::string& dir) const {
  if (!dir.empty()) return root_.Resolve(dir, "checkpoint directory");
  if (!spec.checkpoint_dir().empty()) return root_.Resolve(spec.checkpoint_dir(), "checkpoint_dir");
  return default_dir_;
}

bool Checkpointer::Track(grpc::ClientContext* context, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  calls_[context] = job_id;
  return true;
}

void Checkpointer::CancelSaves(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  for (const auto& [context, id] : calls_) {
    if (id == job_id) context->TryCancel();
  }
}

void Checkpointer::Untrack(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  calls_.erase(context);
}

void Checkpointer::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [context, job_id] : calls_) context->TryCancel();
    threads.swap(periodic_);
  }
  for (std::thread& t : threads) t.join();
}

absl::StatusOr<int64_t> Checkpointer::NewestAppliedStep(const v1::JobInfo& job) {
  auto results = FanOutAndWait<v1::ListChunksResponse>(
      ServersOf(job), kListTimeout,
      [&](const std::string& address, grpc::ClientContext* context, v1::ListChunksResponse* out,
          std::function<void(grpc::Status)> done) {
        auto request = std::make_shared<v1::ListChunksRequest>();
        request->set_job_id(job.spec().job_id());
        stub_for_(address)->async()->ListChunks(
            context, request.get(), out,
            [request, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
      });
  int64_t newest = 0;
  for (auto& r : results) {
    RETURN_IF_ERROR(r->status);
    for (const auto& c : r->response.chunks()) newest = std::max(newest, c.applied_step());
  }
  return newest;
}

absl::StatusOr<v1::CheckpointInfo> Checkpointer::Save(const v1::JobInfo& job,
                                                      const std::string& dir, int64_t step,
                                                      absl::Duration wait) {
  const std::string& job_id = job.spec().job_id();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("the coordinator is stopping");
    if (!saving_.insert(job_id).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("a checkpoint of job '", job_id, "' is being saved; try again after it"));
    }
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    saving_.erase(job_id);
  };
  if (step >= 0) return SaveAt(job, dir, step, wait);
  for (int choice = 1;; ++choice) {
    ASSIGN_OR_RETURN(int64_t newest, NewestAppliedStep(job));
    absl::StatusOr<v1::CheckpointInfo> saved = SaveAt(job, dir, newest, wait);
    // ABORTED: a chunk went past the step before it was armed.
    if (!absl::IsAborted(saved.status()) || choice == kMaxStepChoices) return saved;
  }
}

absl::StatusOr<v1::CheckpointInfo> Checkpointer::SaveAt(const v1::JobInfo& job,
                                                        const std::string& dir, int64_t step,
                                                        absl::Duration wait) {
  const absl::Time started = absl::Now();
  const std::string& job_id = job.spec().job_id();
  ASSIGN_OR_RETURN(std::string partial, BeginCheckpoint(root_, dir, job_id, step));
  // Each chunk is saved by its primary copy; its other copies checksum
  // their state at the step, to be compared with the primary's file.
  const bool replicated = job.spec().replicas() > 1;
  auto results = FanOutAndWait<v1::SaveChunksResponse>(
      replicated ? ServersOf(job) : PrimaryServersOf(job), wait + kWriteTimeout,
      [&](const std::string& address, grpc::ClientContext* context, v1::SaveChunksResponse* out,
          std::function<void(grpc::Status)> done) {
        if (!Track(context, job_id)) context->TryCancel();
        auto request = std::make_shared<v1::SaveChunksRequest>();
        request->set_job_id(job_id);
        request->set_step(step);
        request->set_dir(partial);
        request->set_wait_ms(absl::ToInt64Milliseconds(wait));
        if (replicated) {
          for (uint32_t id : PrimariesOn(job, address)) request->add_chunk_ids(id);
          for (uint32_t id : ReplicasOn(job, address)) request->add_checksum_chunk_ids(id);
        }
        stub_for_(address)->async()->SaveChunks(
            context, request.get(), out,
            [this, context, request, done = std::move(done)](grpc::Status s) {
              Untrack(context);
              done(std::move(s));
            });
      });
  internal::CheckpointManifest manifest;
  absl::Status status;
  // The replicas' checksums: chunk id -> (server, checksum).
  std::multimap<uint32_t, std::pair<std::string, uint64_t>> replica_checksums;
  for (auto& r : results) {
    if (!r->status.ok() && PrimariesOn(job, r->address).empty()) {
      // Only replicas' checksums were asked of it: the checkpoint stands.
      LogEventCat("coordinator", "job ", job_id, ": the copies on ", r->address,
                  " were not compared at step ", step, ": ", r->status.ToString());
      continue;
    }
    status.Update(r->status);
    for (auto& f : *r->response.mutable_files()) {
      if (f.file().empty()) {
        replica_checksums.emplace(f.chunk().chunk_id(), std::make_pair(r->address, f.checksum()));
      } else {
        *manifest.add_files() = std::move(f);
      }
    }
    manifest.set_write_seconds(std::max(manifest.write_seconds(), r->response.write_seconds()));
    if (r->response.has_loss_scale()) *manifest.mutable_loss_scale() = r->response.loss_scale();
  }
  if (!status.ok()) {
    AbandonCheckpoint(root_, partial);
    return status;
  }
  *manifest.mutable_spec() = job.spec();
  manifest.set_flat_num_params(job.flat_num_params());
  manifest.set_step(step);
  manifest.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
  manifest.set_samples_consumed(static_cast<uint64_t>(step) * job.spec().samples_per_step());
  manifest.set_save_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  absl::StatusOr<std::string> path = CommitCheckpoint(root_, partial, manifest);
  if (!path.ok()) {
    AbandonCheckpoint(root_, partial);
    return path.status();
  }
  CompareReplicas(job, step, manifest, replica_checksums);
  v1::CheckpointInfo info = InfoOf(manifest, *path);
  LogEventCat("coordinator", "job ", job_id, ": checkpoint of step ", step, " saved to ", *path,
              " (", info.num_bytes(), " bytes in ", info.save_seconds(), " s)");
  if (absl::Status pruned = PruneCheckpoints(root_, dir, job_id, job.spec().checkpoint_keep_last());
      !pruned.ok()) {
    LogEventCat("coordinator", "job ", job_id, ": ", pruned.message());
  }
  return info;
}

void Checkpointer::CompareReplicas(
    const v1::JobInfo& job, int64_t step, const internal::CheckpointManifest& manifest,
    const std::multimap<uint32_t, std::pair<std::string, uint64_t>>& replica_checksums) {
  std::map<uint32_t, uint64_t> primary;
  for (const v1::CheckpointFile& f : manifest.files()) primary[f.chunk().chunk_id()] = f.checksum();
  for (const auto& [chunk_id, replica] : replica_checksums) {
    const auto& [address, checksum] = replica;
    auto it = primary.find(chunk_id);
    if (it == primary.end() || it->second == checksum) continue;
    const absl::Status diverged = absl::DataLossError(absl::StrCat(
        "job '", job.spec().job_id(), "': the copy of chunk ", chunk_id, " on shard server ",
        address, " has checksum ", absl::Hex(checksum, absl::kZeroPad16), " at step ", step,
        ", its primary's file ", absl::Hex(it->second, absl::kZeroPad16),
        "; the copy is seeded again from the primary"));
    LogEventCat("coordinator", diverged.ToString());
    on_divergent_(job.spec().job_id(), chunk_id, address);
  }
}

void Checkpointer::StartPeriodic(const v1::JobInfo& job) {
  if (job.spec().checkpoint_every_steps() == 0) return;
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  periodic_.emplace_back([this, job_id = job.spec().job_id()] { RunPeriodic(job_id); });
}

void Checkpointer::RunPeriodic(const std::string& job_id) {
  uint64_t placement_version = 0;
  int64_t next = -1;
  while (true) {
    absl::StatusOr<v1::JobInfo> job = job_for_(job_id);
    if (!job.ok()) return;
    const int64_t every = static_cast<int64_t>(job->spec().checkpoint_every_steps());
    const absl::StatusOr<std::string> dir = DirFor(job->spec(), "");
    if (!dir.ok()) {
      LogEventCat("coordinator", "job ", job_id,
                  ": no periodic checkpoints: ", dir.status().message());
      return;
    }
    // At first, and when the job resumed from a checkpoint after its chunks
    // moved: the multiple after its restored step and newest checkpoint.
    if (next < 0 || job->placement_version() != placement_version) {
      placement_version = job->placement_version();
      int64_t base = job->restored_step();
      if (auto listed = ListCheckpoints(root_, *dir, job_id); listed.ok() && !listed->empty()) {
        base = std::max(base, listed->back().step());
      }
      next = (base / every + 1) * every;
    }
    absl::StatusOr<v1::CheckpointInfo> saved = Save(*job, *dir, next, kPeriodicWait);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (saved.ok()) {
      next += every;
      continue;
    }
    if (absl::IsAborted(saved.status())) {
      // The job went past `next` before it was armed (the previous save was
      // still writing, or the coordinator restarted): the next multiple.
      absl::StatusOr<int64_t> newest = NewestAppliedStep(*job);
      if (newest.ok()) {
        // The first multiple no chunk is past: a chunk at the newest step
        // can still be armed for it.
        const int64_t skipped = next;
        next = (*newest + every - 1) / every * every;
        LogEventCat("coordinator", "job ", job_id, ": no checkpoint of step ", skipped,
                    ": the job passed it before it could be armed; the next is step ", next);
      }
    } else if (!absl::IsDeadlineExceeded(saved.status())) {
      LogEventCat("coordinator", "job ", job_id, ": periodic checkpoint of step ", next,
                  " failed (", saved.status().ToString(), "); trying again");
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
    }
  }
}

}  // namespace strata
