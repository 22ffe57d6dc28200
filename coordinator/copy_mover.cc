// CoordinatorService's copy moves (coordinator_service.h): a job's chunk
// copies change servers while it trains -- a lost server's copies are
// seeded again on the servers left, a draining server's move off, a
// rebalance spreads them -- each a step boundary that no step crosses: the
// workers re-form in a new generation and wait for the new placement while
// the servers, fenced against the old generation, hold still and each new
// copy's server seeds it from a live one (SeedChunks: server to server).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/await.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_info.h"
#include "coordinator/placement.h"
#include "coordinator/seed_plan.h"
#include "core/chunk_bytes.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

// A SeedChunks call ends within a minute plus its bytes at this rate.
constexpr double kMinSeedBytesPerSecond = 20e6;

bool SamePlacement(const v1::JobInfo& a, const v1::JobInfo& b) {
  for (int i = 0; i < a.chunks_size(); ++i) {
    if (CopiesOf(a.chunks(i)) != CopiesOf(b.chunks(i))) return false;
  }
  return true;
}

// `after` plus the copies of `before` on live servers that it leaves out:
// what the servers hold while a move seeds its new copies.
v1::JobInfo BothPlacements(const v1::JobInfo& before, const v1::JobInfo& after,
                           const IsLost& is_lost) {
  v1::JobInfo both = after;
  for (int i = 0; i < before.chunks_size(); ++i) {
    for (const std::string& address : CopiesOf(before.chunks(i))) {
      if (!HoldsCopy(both.chunks(i), address) && !is_lost(address)) {
        both.mutable_chunks(i)->add_replica_addresses(address);
      }
    }
  }
  return both;
}

// Adds one job's move, `copied`, to `moved`.
void AddMoved(const v1::CopiesMoved& copied, v1::CopiesMoved* moved) {
  moved->set_jobs(moved->jobs() + 1);
  moved->set_copies(moved->copies() + copied.copies());
  moved->set_torn(moved->torn() + copied.torn());
  moved->set_bytes(moved->bytes() + copied.bytes());
  moved->set_copy_seconds(moved->copy_seconds() + copied.copy_seconds());
  moved->set_prepared(moved->prepared() + copied.prepared());
  moved->set_built_in_place(moved->built_in_place() + copied.built_in_place());
  moved->set_prepare_seconds(moved->prepare_seconds() + copied.prepare_seconds());
  moved->set_fenced_seconds(moved->fenced_seconds() + copied.fenced_seconds());
  moved->set_at_step_boundary(moved->at_step_boundary() + copied.at_step_boundary());
  moved->set_boundary_wait_seconds(moved->boundary_wait_seconds() + copied.boundary_wait_seconds());
}

}  // namespace

std::vector<v1::ServerRecord> CoordinatorService::PlacementServers() const {
  std::vector<v1::ServerRecord> live;
  for (const auto& [address, server] : registry_.servers()) {
    if (!monitor_->IsLost(address) && !server.draining()) live.push_back(server);
  }
  return live;
}

std::vector<const v1::JobInfo*> CoordinatorService::PlacedJobs() const {
  std::vector<const v1::JobInfo*> placed;
  for (const auto& [id, job] : registry_.jobs()) placed.push_back(&job);
  return placed;
}

absl::Status CoordinatorService::MoveCopies(const std::string& job_id, const PlanCopies& plan,
                                            const std::string& why, v1::CopiesMoved* moved,
                                            bool compare_unmoved) {
  absl::MutexLock moves(&moves_mu_);
  const absl::Time started = absl::Now();
  v1::JobInfo before, after;
  {
    absl::MutexLock lock(&mu_);
    const v1::JobInfo* job = registry_.FindJob(job_id);
    if (job == nullptr) return UnknownJob(job_id);
    if (creating_.contains(job_id)) {
      return absl::UnavailableError(absl::StrCat("job '", job_id, "' is being created"));
    }
    // Its copies there are no source (AllocateChunks would refuse them):
    // they leave the placement first, after the next round of health checks.
    if (auto emptied = emptied_.find(job_id); emptied != emptied_.end()) {
      return absl::UnavailableError(
          absl::StrCat("job '", job_id, "': shard server ", *emptied->second.begin(),
                       " came back without its chunks; its copies leave the placement first"));
    }
    before = after = *job;
    RETURN_IF_ERROR(plan(&after));
    if (SamePlacement(before, after) && !(compare_unmoved && before.spec().replicas() > 1)) {
      return absl::OkStatus();
    }
    moving_.insert(job_id);
  }
  absl::Cleanup not_moving = [&] {
    absl::MutexLock lock(&mu_);
    moving_.erase(job_id);
  };
  after.set_placement_version(before.placement_version() + 1);
  auto both = std::make_shared<v1::JobInfo>(BothPlacements(before, after, is_lost_));
  v1::CopiesMoved copied;
  absl::Status status = PrepareCopies(before, after, both, why, &copied);
  if (!status.ok()) {
    KeepPlacedCopies(*both, before, /*generation=*/0);
    return status;
  }
  // The workers finish the step they run and wait for the new placement
  // before the next: the servers are fenced once they all stopped, or the
  // step under way is cut after a lease (a worker that does not stop).
  ASSIGN_OR_RETURN(const uint64_t generation, StopAtStepBoundary(job_id, after, &copied));
  const absl::Time paused = absl::Now();
  status = SeedFenced(before, after, both, generation, &copied);
  // The workers go on with the new placement, or on the old one (as a new
  // version) when the copies could not be seeded.
  v1::JobInfo placed = after;
  if (!status.ok()) {
    placed = before;
    placed.set_placement_version(after.placement_version());
  }
  const absl::Status committed = RecordPlacement(placed);
  copied.set_fenced_seconds(absl::ToDoubleSeconds(absl::Now() - paused));
  KeepPlacedCopies(*both, committed.ok() ? placed : before, generation);
  status.Update(committed);
  if (!status.ok()) return status;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LogEventCat(
      "coordinator", "job ", job_id, " (", why, "): ", copied.copies(), " chunk copies seeded and ",
      copied.torn(), " torn by a step cut short seeded again (", copied.prepared(),
      " built while it trained, ", copied.built_in_place(), " of them in place, in ",
      copied.prepare_seconds(), " s; ", copied.bytes(), " bytes) in ", seconds,
      " s; its workers waited ", copied.fenced_seconds(), " s (copies ", copied.copy_seconds(),
      " s) and resume from the step they reached in generation ", generation);
  if (moved != nullptr) AddMoved(copied, moved);
  return absl::OkStatus();
}

absl::Status CoordinatorService::PrepareCopies(const v1::JobInfo& before, const v1::JobInfo& after,
                                               std::shared_ptr<const v1::JobInfo> both,
                                               const std::string& why, v1::CopiesMoved* copied) {
  // The new copies start empty, also on a server that holds a stale one
  // (not in `before`: no worker pushes to it). They are made first, while
  // the job trains -- fenced against no generation, every server goes on;
  // their memory is faulted in by the seed that fills it -- so that their
  // targets build them in place.
  RETURN_IF_ERROR(AwaitAllocate(both, /*min_generation=*/0, ShardFleet::Absent::kRefuse,
                                NewCopies(before, after)));
  const absl::Time started = absl::Now();
  absl::Status prepared;
  if (absl::StatusOr<SeedPlan> new_copies = PlanSeeds(before, after, is_lost_); new_copies.ok()) {
    prepared = SeedCopies(before, *new_copies, /*prepare=*/true, copied);
  }
  copied->set_prepare_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  if (!prepared.ok()) {
    LogEventCat("coordinator", "job ", before.spec().job_id(), " (", why,
                "): copies not built aside are copied whole once fenced: ", prepared.ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CoordinatorService::StopAtStepBoundary(const std::string& job_id,
                                                                const v1::JobInfo& after,
                                                                v1::CopiesMoved* copied) {
  v1::JobSummary summary;
  membership_->Summarize(job_id, &summary);
  const absl::Time started = absl::Now();
  ASSIGN_OR_RETURN(const uint64_t generation,
                   membership_->ChunksMoved(job_id, after.placement_version(),
                                            summary.committed_step(), /*at_step_boundary=*/true));
  const bool stopped = membership_->AwaitStepBoundary(job_id, generation);
  copied->set_boundary_wait_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  if (stopped) {
    copied->set_at_step_boundary(1);
    return generation;
  }
  membership_->Summarize(job_id, &summary);
  return membership_->ChunksMoved(job_id, after.placement_version(), summary.committed_step());
}

absl::Status CoordinatorService::SeedFenced(const v1::JobInfo& before, const v1::JobInfo& after,
                                            std::shared_ptr<const v1::JobInfo> both,
                                            uint64_t generation, v1::CopiesMoved* copied) {
  RETURN_IF_ERROR(AwaitAllocate(both, generation, ShardFleet::Absent::kRefuse));
  const absl::Time fenced = absl::Now();
  absl::StatusOr<SeedPlan> seeds = PlanCopySeeds(before, after, both, generation, copied);
  absl::Status status =
      seeds.ok() ? SeedCopies(before, *seeds, /*prepare=*/false, copied) : seeds.status();
  copied->set_copy_seconds(absl::ToDoubleSeconds(absl::Now() - fenced));
  return status;
}

absl::Status CoordinatorService::RecordPlacement(const v1::JobInfo& placed) {
  const std::string& job_id = placed.spec().job_id();
  absl::MutexLock lock(&mu_);
  if (registry_.FindJob(job_id) == nullptr) return UnknownJob(job_id);
  return registry_.PutJob(placed);
}

void CoordinatorService::KeepPlacedCopies(const v1::JobInfo& both, const v1::JobInfo& kept,
                                          uint64_t generation) {
  // Each server keeps the copies placed on it; the others drop the job.
  AwaitAllocate(std::make_shared<v1::JobInfo>(kept), generation, ShardFleet::Absent::kRefuse)
      .IgnoreError();
  std::vector<std::string> emptied;
  for (const std::string& address : ServersOf(both)) {
    if (!HasChunksOn(kept, address)) emptied.push_back(address);
  }
  if (!emptied.empty()) DropJobOn(kept.spec().job_id(), emptied);
}

absl::Status CoordinatorService::AwaitAllocate(std::shared_ptr<const v1::JobInfo> job,
                                               uint64_t min_generation, ShardFleet::Absent absent,
                                               ShardFleet::SeededChunks seeded,
                                               std::vector<std::string>* allocated) {
  auto made_anew = std::make_shared<ShardFleet::SeededChunks>(std::move(seeded));
  return Await([&](auto done) {
    fleet_.Allocate(
        std::move(job), min_generation, absent,
        [allocated, done](absl::Status s, std::vector<std::string> servers) {
          if (allocated != nullptr) *allocated = std::move(servers);
          done(std::move(s));
        },
        made_anew);
  });
}

void CoordinatorService::DropJobOn(const std::string& job_id,
                                   const std::vector<std::string>& addresses) {
  Await([&](auto done) {
    fleet_.Drop(job_id, addresses, /*wait_for_ready=*/false,
                [done](std::vector<std::string>) { done(absl::OkStatus()); });
  }).IgnoreError();
}

absl::StatusOr<SeedPlan> CoordinatorService::PlanCopySeeds(const v1::JobInfo& before,
                                                           const v1::JobInfo& after,
                                                           std::shared_ptr<const v1::JobInfo> both,
                                                           uint64_t generation,
                                                           v1::CopiesMoved* copied) {
  ASSIGN_OR_RETURN(SeedPlan plan, PlanSeeds(before, after, is_lost_));
  for (const auto& [servers, chunks] : plan) copied->set_copies(copied->copies() + chunks.size());
  if (before.spec().replicas() <= 1) return plan;
  // The servers hold still: each old copy's step and round are final.
  std::vector<std::string> live;
  for (const std::string& address : ServersOf(before)) {
    if (!is_lost_(address)) live.push_back(address);
  }
  std::map<std::string, std::vector<v1::ChunkStatus>> statuses;
  Await([&](auto done) {
    fleet_.ListChunks(
        live, before.spec().job_id(), /*wait_for_ready=*/false, [&statuses, done](auto& results) {
          for (const auto& r : results) {
            if (!r->status.ok()) continue;
            statuses[r->address].assign(r->response.chunks().begin(), r->response.chunks().end());
          }
          done(absl::OkStatus());
        });
  }).IgnoreError();
  TornCopies torn = FindTornCopies(before, after, statuses, is_lost_);
  if (torn.by_server.empty()) return plan;
  // Made anew (empty) where they sit, then seeded like new copies.
  RETURN_IF_ERROR(AwaitAllocate(both, generation, ShardFleet::Absent::kRefuse, torn.by_server));
  for (auto& [servers, chunks] : torn.plan) {
    copied->set_torn(copied->torn() + chunks.size());
    std::vector<v1::ChunkSpec>& planned = plan[servers];
    planned.insert(planned.end(), chunks.begin(), chunks.end());
  }
  return plan;
}

absl::Status CoordinatorService::SeedCopies(const v1::JobInfo& before, const SeedPlan& plan,
                                            bool prepare, v1::CopiesMoved* copied) {
  const DType dtype = DTypeFromProto(before.spec().dtype()).value_or(DType::kFp32);
  const StatePrecision precision = StatePrecisionOf(before.spec());
  // One call per (target, source), all at once; each target reads its source.
  struct Call {
    v1::SeedChunksRequest request;
    v1::SeedChunksResponse response;
    absl::Duration timeout;
    absl::Status status;
  };
  std::vector<Call> calls(plan.size());
  std::vector<std::thread> threads;
  size_t i = 0;
  for (const auto& [servers, chunks] : plan) {
    Call& call = calls[i++];
    call.request.set_job_id(before.spec().job_id());
    call.request.set_source_address(servers.second);
    call.request.set_worker_token(before.worker_token());
    if (prepare) {
      call.request.set_prepare(true);
      *call.request.mutable_spec() = before.spec();
    }
    uint64_t bytes = 0;
    for (const v1::ChunkSpec& chunk : chunks) {
      *call.request.add_chunks() = chunk;
      bytes += ChunkBytes(chunk.num_params(), dtype, precision);
    }
    call.timeout =
        absl::Minutes(1) + absl::Seconds(static_cast<double>(bytes) / kMinSeedBytesPerSecond);
    threads.emplace_back([this, &call, target = servers.first] {
      call.status = CallUnary(fleet_.Stub(target), &v1::ShardServer::Stub::SeedChunks, call.request,
                              &call.response, call.timeout);
      if (!call.status.ok()) {
        call.status = absl::Status(call.status.code(), absl::StrCat("seeding copies on ", target,
                                                                    ": ", call.status.message()));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  absl::Status status;
  for (const Call& call : calls) {
    status.Update(call.status);
    // What was built aside counts once it is written into its chunk.
    if (prepare) {
      copied->set_built_in_place(copied->built_in_place() + call.response.in_place());
    } else {
      copied->set_prepared(copied->prepared() + call.response.prepared());
    }
    copied->set_bytes(copied->bytes() + call.response.bytes());
  }
  return status;
}

void CoordinatorService::RestoreReplicas(RestoreWhen when) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, job] : registry_.jobs()) {
      const int want = static_cast<int>(std::max<uint32_t>(job.spec().replicas(), 1));
      if (std::any_of(job.chunks().begin(), job.chunks().end(),
                      [&](const auto& c) { return 1 + c.replica_addresses_size() < want; })) {
        ids.push_back(id);
      }
    }
  }
  // Jobs with all their copies, and deleted ones, start over.
  restore_retries_.ForgetAllBut(ids);
  for (const std::string& id : ids) {
    if (when == RestoreWhen::kDue && !restore_retries_.Due(id, absl::Now())) continue;
    absl::Status restored = MoveCopies(
        id,
        [this](v1::JobInfo* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          AddMissingCopies(PlacementServers(), PlacedJobs(), job);
          return absl::OkStatus();
        },
        "restoring its replica count", nullptr);
    if (restored.ok() || absl::IsNotFound(restored)) {
      restore_retries_.Forget(id);
    } else if (restore_retries_.Failed(id, restored.ToString(), absl::Now())) {
      LogEventCat("coordinator", "job ", id, ": replicas not restored yet (tried again after ",
                  absl::FormatDuration(restore_retries_.Delay(id)),
                  ", doubling while it fails, and when a server registers; logged again when ",
                  "the failure changes): ", restored.ToString());
    }
  }
  restore_again_ = !restore_retries_.empty();
}

void CoordinatorService::ReseedCopy(const std::string& job_id, uint32_t chunk_id,
                                    const std::string& address) {
  absl::Status moved = MoveCopies(
      job_id,
      [&](v1::JobInfo* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
          if (a.chunk().chunk_id() != chunk_id || !HoldsCopy(a, address)) continue;
          // The primary stays the primary: its state is the one kept.
          if (a.server_address() == address) {
            return absl::FailedPreconditionError(
                absl::StrCat("the copy on ", address, " is the primary now"));
          }
          std::vector<std::string> kept = CopiesOf(a);
          kept.erase(std::find(kept.begin(), kept.end(), address));
          a.mutable_replica_addresses()->Assign(kept.begin() + 1, kept.end());
        }
        std::vector<v1::ServerRecord> others;
        for (v1::ServerRecord& server : PlacementServers()) {
          if (server.address() != address) others.push_back(std::move(server));
        }
        AddMissingCopies(others, PlacedJobs(), job);
        return absl::OkStatus();
      },
      absl::StrCat("its copy of chunk ", chunk_id, " on ", address, " diverged"), nullptr);
  if (!moved.ok()) {
    LogEventCat("coordinator", "job ", job_id, ": the diverged copy of chunk ", chunk_id, " on ",
                address, " stays for now: ", moved.ToString());
  }
  // Where no other server had room, the copy comes back on `address`, seeded anew.
  RestoreReplicas(RestoreWhen::kNow);
}

void CoordinatorService::CheckCopies(const std::string& job_id) {
  absl::Status checked = MoveCopies(
      job_id, [](v1::JobInfo*) { return absl::OkStatus(); },
      "a worker was lost: its copies are compared", nullptr, /*compare_unmoved=*/true);
  if (!checked.ok() && !absl::IsNotFound(checked)) {
    LogEventCat("coordinator", "job ", job_id, ": copies not compared: ", checked.ToString());
  }
}

absl::Status CoordinatorService::DoDrain(const v1::DrainServerRequest& request,
                                         v1::CopiesMoved* moved) {
  const absl::Time started = absl::Now();
  const std::string& address = request.address();
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    const v1::ServerRecord* known = registry_.FindServer(address);
    if (known == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("address: no shard server ", Quoted(address), " is registered"));
    }
    v1::ServerRecord record = *known;
    record.set_draining(!request.cancel());
    RETURN_IF_ERROR(registry_.PutServer(record));
    if (request.cancel()) {
      LogEventCat("coordinator", "shard server ", address, " takes chunks again");
      return absl::OkStatus();
    }
    for (const auto& [id, job] : registry_.jobs()) {
      if (HasChunksOn(job, address)) ids.push_back(id);
    }
  }
  LogEventCat("coordinator", "draining shard server ", address, ": ", ids.size(), " job(s)");
  const std::string why = absl::StrCat("shard server ", address, " drains");
  for (const std::string& id : ids) {
    absl::Status drained = MoveCopies(
        id,
        [&](v1::JobInfo* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const v1::JobInfo before = *job;
          RemoveCopies({address}, job);
          AddMissingCopies(PlacementServers(), PlacedJobs(), job);
          for (int i = 0; i < job->chunks_size(); ++i) {
            const size_t had = CopiesOf(before.chunks(i)).size();
            if (job->chunks(i).server_address().empty() || CopiesOf(job->chunks(i)).size() < had) {
              return absl::FailedPreconditionError(absl::StrCat(
                  "job '", id, "': no other live shard server can take a copy of chunk ",
                  job->chunks(i).chunk().chunk_id(), " (", job->chunks(i).chunk().num_params(),
                  " params)"));
            }
          }
          return absl::OkStatus();
        },
        why, moved);
    if (!drained.ok() && !absl::IsNotFound(drained)) {
      LogEventCat("coordinator", "job ", id, " (", why,
                  "): its copies stay where they were: ", drained.ToString());
      return drained;
    }
  }
  moved->set_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  return absl::OkStatus();
}

absl::Status CoordinatorService::DoRebalance(const std::string& job_id, v1::CopiesMoved* moved) {
  const absl::Time started = absl::Now();
  const absl::Status rebalanced = MoveCopies(
      job_id,
      [this](v1::JobInfo* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        RebalanceCopies(PlacementServers(), PlacedJobs(), job);
        return absl::OkStatus();
      },
      "rebalance", moved);
  if (!rebalanced.ok()) {
    LogEventCat("coordinator", "job ", Quoted(job_id),
                " (rebalance): its copies stay where they were: ", rebalanced.ToString());
    return rebalanced;
  }
  moved->set_seconds(absl::ToDoubleSeconds(absl::Now() - started));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::DrainServer(grpc::CallbackServerContext* ctx,
                                                          const v1::DrainServerRequest* request,
                                                          v1::DrainServerResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  movers_.Schedule([this, reactor, request, response] {
    reactor->Finish(ToGrpcStatus(DoDrain(*request, response->mutable_moved())));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::RebalanceJob(grpc::CallbackServerContext* ctx,
                                                           const v1::RebalanceJobRequest* request,
                                                           v1::RebalanceJobResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  movers_.Schedule([this, reactor, request, response] {
    reactor->Finish(ToGrpcStatus(DoRebalance(request->job_id(), response->mutable_moved())));
  });
  return reactor;
}

}  // namespace strata
