// CoordinatorService's job moves (coordinator_service.h): a job leaves a lost
// shard server for the live ones, restored from its newest checkpoint, and a
// server that comes back drops the jobs that are no longer placed on it.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_info.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "strata/internal/records.pb.h"

namespace strata {

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
  ASSIGN_OR_RETURN(const std::string dir, checkpointer_.DirFor(job.spec(), ""));
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints,
                   strata::ListCheckpoints(dir, job_id));
  if (checkpoints.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it has no checkpoint in ", dir, " to resume from; it waits for the server to return"));
  }
  auto moved = std::make_shared<v1::JobInfo>(job);
  moved->set_placement_version(job.placement_version() + 1);
  ASSIGN_OR_RETURN(internal::CheckpointManifest read,
                   PlanRestore(checkpoints.back().path(), moved.get()));
  auto manifest = std::make_shared<const internal::CheckpointManifest>(std::move(read));
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
      fleet_.Drop(job_id, addresses, /*wait_for_ready=*/false,
                  [done](std::vector<std::string>) { done(absl::OkStatus()); });
    }).IgnoreError();
  };
  drop({stale.begin(), stale.end()});
  std::vector<std::string> allocated;
  absl::Status status = Await([&](auto done) {
    fleet_.Allocate(moved, generation,
                    [&allocated, done](absl::Status s, std::vector<std::string> servers) {
                      allocated = std::move(servers);
                      done(std::move(s));
                    });
  });
  if (status.ok()) status = Await([&](auto done) { fleet_.Load(moved, manifest, done); });
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    if (jobs_.count(job_id) == 0) {
      status = absl::NotFoundError(absl::StrCat("job '", job_id, "' was deleted during the move"));
      // The move opened a generation for it again.
      membership_->Forget(job_id).IgnoreError();
    } else {
      status = WriteJob(*moved);
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
    fleet_.Drop(job_id, returned, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
  }
  LogEventCat("coordinator", "job ", job_id, ": chunks moved to ", ServersOf(*moved).size(),
              " live shard server(s) in ", absl::FormatDuration(absl::Now() - started),
              "; it resumes from checkpoint ", moved->restored_from(), " (step ", manifest->step(),
              ", ", std::max<int64_t>(before.committed_step() - manifest->step(), 0),
              " step(s) after it are lost)");
  return absl::OkStatus();
}

void CoordinatorService::DropStaleJobs(const std::string& address) {
  fleet_.ListChunks({address}, /*job_id=*/"", /*wait_for_ready=*/true, [this](auto& results) {
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
      fleet_.Drop(id, {listed.address}, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
    }
  });
}

}  // namespace strata
