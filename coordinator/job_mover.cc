// CoordinatorService's job moves (coordinator_service.h): a job loses the
// copies of its chunks on a lost shard server and goes on from the others,
// or, where a chunk had no other, leaves the lost server for the live ones,
// restored from its newest checkpoint; a
// server that comes back drops the jobs that are no longer placed on it, and
// a job whose chunks it came back without resumes from its checkpoint.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/await.h"
#include "coordinator/checkpoint_store.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_info.h"
#include "coordinator/placement.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "strata/internal/records.pb.h"

namespace strata {

void CoordinatorService::OnServerLost(const std::string& address) {
  // A move waiting for its workers' step boundary waits no more: their
  // steps may need the lost server (DropCopies waits for the move).
  membership_->EndStepBoundaryWaits();
  std::vector<std::string> affected;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : registry_.jobs()) {
      if (HasChunksOn(job, address)) affected.push_back(id);
    }
  }
  const std::string why = absl::StrCat("shard server ", address, " is lost");
  for (const std::string& id : affected) {
    absl::Status dropped = DropCopies(id, {}, why);
    if (absl::IsFailedPrecondition(dropped) && MoveDue(id)) {
      NoteMoveFailure(id, why, MoveJob(id, why));
    }
  }
}

absl::Status CoordinatorService::DropCopies(const std::string& job_id,
                                            const std::set<std::string>& gone,
                                            const std::string& why) {
  absl::MutexLock moves(&moves_mu_);
  v1::JobInfo kept;
  {
    absl::MutexLock lock(&mu_);
    const v1::JobInfo* job = registry_.FindJob(job_id);
    if (job == nullptr) return UnknownJob(job_id);
    kept = *job;
    std::set<std::string> dropped = gone;
    for (const std::string& address : ServersOf(kept)) {
      if (monitor_->IsLost(address)) dropped.insert(address);
    }
    RemoveCopies(dropped, &kept);
    for (const v1::ChunkAssignment& a : kept.chunks()) {
      if (a.server_address().empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("chunk ", a.chunk().chunk_id(), " has no other copy"));
      }
    }
    kept.set_placement_version(kept.placement_version() + 1);
    RETURN_IF_ERROR(registry_.PutJob(kept));
    ForgetEmptied(job_id, dropped);
  }
  // The workers stop the step they run and re-form on the copies left; the
  // step is completed (or found applied) there.
  v1::JobSummary summary;
  membership_->Summarize(job_id, &summary);
  RETURN_IF_ERROR(
      membership_->ChunksMoved(job_id, kept.placement_version(), summary.committed_step())
          .status());
  LogEventCat("coordinator", "job ", job_id, " (", why,
              "): goes on from the other copies of its chunks on ", ServersOf(kept).size(),
              " live shard server(s); no step lost");
  movers_.Schedule([this] { RestoreReplicas(RestoreWhen::kNow); });
  return absl::OkStatus();
}

void CoordinatorService::RecoverEmptiedJobs() {
  std::vector<std::pair<std::string, std::set<std::string>>> emptied;
  {
    absl::MutexLock lock(&mu_);
    emptied.assign(emptied_.begin(), emptied_.end());
  }
  for (const auto& [id, servers] : emptied) {
    const std::string why = "a shard server restarted without its chunks, or lost their state";
    absl::Status moved = DropCopies(id, servers, why);
    if (absl::IsFailedPrecondition(moved)) {
      if (!MoveDue(id)) continue;
      moved = MoveJob(id, why);
      NoteMoveFailure(id, why, moved);
    }
    // A deleted job has nothing left to recover.
    if (moved.ok() || absl::IsNotFound(moved)) {
      absl::MutexLock lock(&mu_);
      ForgetEmptied(id, servers);
    }
  }
}

void CoordinatorService::ForgetEmptied(const std::string& job_id,
                                       const std::set<std::string>& servers) {
  auto it = emptied_.find(job_id);
  if (it == emptied_.end()) return;
  for (const std::string& address : servers) it->second.erase(address);
  if (it->second.empty()) emptied_.erase(it);
}

void CoordinatorService::RecheckServers() {
  std::set<std::string> servers;
  {
    absl::MutexLock lock(&mu_);
    servers.swap(recheck_);
  }
  for (const std::string& address : servers) CheckJobsOn(address);
}

bool CoordinatorService::MoveDue(const std::string& job_id) {
  if (moves_due_now_.exchange(false)) move_retries_.ForgetAllBut({});
  return move_retries_.Due(job_id, absl::Now());
}

void CoordinatorService::NoteMoveFailure(const std::string& job_id, const std::string& why,
                                         const absl::Status& status) {
  if (status.ok() || absl::IsNotFound(status)) {
    move_retries_.Forget(job_id);
  } else if (move_retries_.Failed(job_id, status.ToString(), absl::Now())) {
    LogEventCat("coordinator", "job ", job_id, " cannot resume from a checkpoint yet (", why,
                "; tried again after ", absl::FormatDuration(move_retries_.Delay(job_id)),
                ", doubling while it fails, and when a server registers): ", status.ToString());
  }
}

absl::Status CoordinatorService::MoveJob(const std::string& job_id, const std::string& why) {
  absl::MutexLock moves(&moves_mu_);
  const absl::Time started = absl::Now();
  ASSIGN_OR_RETURN(const v1::JobInfo job, FindJob(job_id));
  ASSIGN_OR_RETURN(const std::string dir, checkpointer_.DirFor(job.spec(), ""));
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints,
                   strata::ListCheckpoints(checkpointer_.root(), dir, job_id));
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
  const int64_t reached = std::max(before.committed_step(), HighestAppliedStep(job_id, stale));
  DropJobOn(job_id, {stale.begin(), stale.end()});
  std::vector<std::string> allocated;
  absl::Status status =
      AwaitAllocate(moved, generation, ShardFleet::Absent::kMakeAnewToLoad, {}, &allocated);
  if (status.ok()) status = Await([&](auto done) { fleet_.Load(moved, manifest, done); });
  if (status.ok()) status = RecordPlacement(*moved);
  if (absl::IsNotFound(status)) {
    status = absl::NotFoundError(absl::StrCat("job '", job_id, "' was deleted during the move"));
    // The move opened a generation for it again.
    membership_->Forget(job_id).IgnoreError();
  }
  if (!status.ok()) {
    DropJobOn(job_id, allocated);
    return status;
  }
  // A lost server that registered again during the move kept the job's
  // chunks (its CheckJobsOn skipped the moving job): drop them now.
  std::vector<std::string> returned;
  for (const std::string& address : lost) {
    if (!monitor_->IsLost(address) && !HasChunksOn(*moved, address)) returned.push_back(address);
  }
  if (!returned.empty()) {
    fleet_.Drop(job_id, returned, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
  }
  LogEventCat("coordinator", "job ", job_id, " (", why, "): chunks moved to ",
              ServersOf(*moved).size(), " live shard server(s) in ",
              absl::FormatDuration(absl::Now() - started), "; it resumes from checkpoint ",
              moved->restored_from(), " (step ", manifest->step(), "; the job had reached step ",
              reached, ": ", std::max<int64_t>(reached - manifest->step(), 0), " step(s) undone)");
  return absl::OkStatus();
}

int64_t CoordinatorService::HighestAppliedStep(const std::string& job_id,
                                               const std::set<std::string>& addresses) {
  int64_t highest = 0;
  Await([&](auto done) {
    fleet_.ListChunks({addresses.begin(), addresses.end()}, job_id, /*wait_for_ready=*/false,
                      [&highest, done](auto& results) {
                        for (const auto& result : results) {
                          for (const v1::ChunkStatus& c : result->response.chunks()) {
                            highest = std::max(highest, c.applied_step());
                          }
                        }
                        done(absl::OkStatus());
                      });
  }).IgnoreError();
  return highest;
}

void CoordinatorService::CheckJobsOn(const std::string& address) {
  // A job placed anew while the server listed its chunks is checked again.
  std::map<std::string, uint64_t> versions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : registry_.jobs()) versions[id] = job.placement_version();
  }
  fleet_.ListChunks({address}, /*job_id=*/"", /*wait_for_ready=*/true,
                    [this, versions](auto& results) {
                      const auto& listed = *results.front();
                      if (!listed.status.ok()) return;
                      CheckListedJobs(listed.address, listed.response, versions);
                    });
}

void CoordinatorService::CheckListedJobs(const std::string& address,
                                         const v1::ListChunksResponse& listed,
                                         const std::map<std::string, uint64_t>& versions) {
  // Job id -> the chunks the server holds of it.
  std::map<std::string, int> held;
  for (const v1::ChunkStatus& c : listed.chunks()) {
    held[c.job_id()] += c.applied_step() >= 0 && c.lost().empty() ? 1 : 0;
  }
  // Job id -> why the server must not keep it.
  std::map<std::string, std::string> stale;
  absl::MutexLock lock(&mu_);
  // A creation or a move places chunks before it commits (both drop what
  // they placed if they fail): the server is checked again after it.
  bool unsettled = false;
  auto settled = [&](const std::string& id) {
    auto version = versions.find(id);
    const v1::JobInfo* job = registry_.FindJob(id);
    const bool still = !creating_.contains(id) && !moving_.contains(id) &&
                       (job == nullptr ||
                        (version != versions.end() && version->second == job->placement_version()));
    unsettled = unsettled || !still;
    return still;
  };
  for (const auto& [id, count] : held) {
    if (!settled(id)) continue;
    const v1::JobInfo* job = registry_.FindJob(id);
    if (job == nullptr) {
      stale[id] = "it is not a job of this coordinator (deleted while the server was away)";
    } else if (!HasChunksOn(*job, address)) {
      stale[id] =
          "none of its chunks is placed there (they moved off, or the job was deleted and "
          "created again while the server was away)";
    }
  }
  for (const auto& [id, job] : registry_.jobs()) {
    if (!settled(id)) continue;
    const int placed = static_cast<int>(ChunksOn(job, address).size());
    const auto it = held.find(id);
    const int kept = it == held.end() ? 0 : it->second;
    if (placed > 0 && kept < placed && emptied_[id].insert(address).second) {
      LogEventCat("coordinator", "job ", id, ": shard server ", address, " holds ", kept,
                  " of its ", placed,
                  " chunk(s) placed there (it restarted without them, or lost their "
                  "state); "
                  "the job goes on from their other copies, or resumes from its newest "
                  "checkpoint");
    }
  }
  if (unsettled) recheck_.insert(address);
  for (const auto& [id, why] : stale) {
    LogEventCat("coordinator", "job ", id, " on shard server ", address, ": ", why,
                "; dropping it there");
    fleet_.Drop(id, {address}, /*wait_for_ready=*/true, [](std::vector<std::string>) {});
  }
}

}  // namespace strata
