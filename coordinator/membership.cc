#include "coordinator/membership.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

constexpr char kMemberPrefix[] = "member/";
constexpr char kGenerationPrefix[] = "generation/";
constexpr size_t kMaxMembers = 4096;
constexpr size_t kMaxAddressBytes = 256;

std::string MemberKey(const std::string& job_id, const std::string& worker_id) {
  return absl::StrCat(kMemberPrefix, job_id, "/", worker_id);
}

absl::Status NotAMember(const std::string& job_id, const std::string& worker_id) {
  return absl::FailedPreconditionError(
      absl::StrCat("worker ", Quoted(worker_id), " is not a member of job '", job_id,
                   "' (it left, or its lease expired); it must join again"));
}

}  // namespace

Membership::Membership(MetadataStore* metadata, absl::Duration lease, Reachability* reachability)
    : metadata_(metadata), lease_(lease), reachability_(reachability) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(MetadataStore* metadata,
                                                               absl::Duration lease,
                                                               Reachability* reachability) {
  if (lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the worker lease must be positive");
  }
  std::unique_ptr<Membership> membership(new Membership(metadata, lease, reachability));
  RETURN_IF_ERROR(membership->Load());
  membership->lease_thread_ = std::thread([m = membership.get()] { m->ExpireLeasesLoop(); });
  return membership;
}

void Membership::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [job_id, job] : jobs_) {
      for (Watcher* w : job.watchers) w->OnStop();
    }
  }
  if (lease_thread_.joinable()) lease_thread_.join();
}

Membership::~Membership() { Stop(); }

void Membership::SetOnMemberLost(std::function<void(const std::string& job_id)> f) {
  absl::MutexLock lock(&mu_);
  on_member_lost_ = std::move(f);
}

absl::Status Membership::Load() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto generations, metadata_->Scan(kGenerationPrefix));
  for (const auto& [key, value] : generations) {
    v1::Generation generation;
    if (!generation.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("coordinator metadata: cannot parse ", key));
    }
    Job& job = jobs_[generation.job_id()];
    job.generation = generation;
    job.placement_version = generation.placement_version();
    // At the latest: the move happened in this generation or before.
    if (job.placement_version > 0) job.moved_in = generation.number();
  }
  ASSIGN_OR_RETURN(auto members, metadata_->Scan(kMemberPrefix));
  absl::Time expiry = absl::Now() + lease_;
  for (const auto& [key, value] : members) {
    size_t begin = strlen(kMemberPrefix);
    std::string job_id = key.substr(begin, key.rfind('/') - begin);
    Member member;
    if (!member.info.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("coordinator metadata: cannot parse ", key));
    }
    member.lease_expiry = expiry;
    jobs_[job_id].members.push_back(std::move(member));
  }
  for (auto& [job_id, job] : jobs_) {
    std::sort(job.members.begin(), job.members.end(), [](const Member& a, const Member& b) {
      return a.info.joined_unix_ms() < b.info.joined_unix_ms();
    });
  }
  return absl::OkStatus();
}

absl::Status Membership::PutMember(const std::string& job_id, const Member& member) {
  return metadata_->Put(MemberKey(job_id, member.info.worker_id()),
                        member.info.SerializeAsString());
}

absl::Status Membership::MaybeOpenGeneration(const std::string& job_id, Job* job, bool changed,
                                             bool at_step_boundary) {
  v1::Generation& generation = job->generation;
  bool first = generation.number() == 0;
  if (first ? job->members.size() < job->initial_world_size : !changed) return absl::OkStatus();
  v1::Generation next;
  next.set_job_id(job_id);
  next.set_number(generation.number() + 1);
  for (const Member& m : job->members) next.add_worker_ids(m.info.worker_id());
  next.set_formed_unix_ms(absl::ToUnixMillis(absl::Now()));
  next.set_placement_version(job->placement_version);
  next.set_at_step_boundary(at_step_boundary);
  RETURN_IF_ERROR(
      metadata_->Put(absl::StrCat(kGenerationPrefix, job_id), next.SerializeAsString()));
  generation = std::move(next);
  LogEventCat("coordinator", "job ", job_id, ": generation ", generation.number(), " with ",
              generation.worker_ids_size(), " worker(s)");
  for (Watcher* w : job->watchers) w->OnGeneration(generation);
  return absl::OkStatus();
}

absl::StatusOr<v1::JoinJobResponse> Membership::Join(const v1::JobSpec& spec,
                                                     const v1::JoinJobRequest& request) {
  if (!IsValidId(request.worker_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", Quoted(request.worker_id()),
                     " must be 1 to 128 of [A-Za-z0-9._-], not . or .."));
  }
  if (request.address().size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker address exceeds ", kMaxAddressBytes, " bytes"));
  }
  const std::string& job_id = spec.job_id();
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  job.initial_world_size = spec.world_size();
  auto it = std::find_if(job.members.begin(), job.members.end(), [&](const Member& m) {
    return m.info.worker_id() == request.worker_id();
  });
  bool is_new = it == job.members.end();
  if (is_new) {
    if (job.members.size() >= kMaxMembers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job '", job_id, "' already has ", job.members.size(), " workers"));
    }
    Member member;
    member.info.set_worker_id(request.worker_id());
    member.info.set_joined_unix_ms(absl::ToUnixMillis(absl::Now()));
    member.info.set_address(request.address());
    RETURN_IF_ERROR(PutMember(job_id, member));
    job.members.push_back(std::move(member));
    it = std::prev(job.members.end());
    LogEventCat("coordinator", "job ", job_id, ": worker ", request.worker_id(), " (",
                Quoted(request.address()), ") joined");
  }
  // A join counts as a heartbeat.
  reachability_->Heard();
  it->lease_expiry = absl::Now() + lease_;
  it->disconnected = false;
  it->info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(absl::Now()));
  RETURN_IF_ERROR(MaybeOpenGeneration(job_id, &job, is_new));
  v1::JoinJobResponse response;
  *response.mutable_generation() = job.generation;
  response.set_lease_ms(absl::ToInt64Milliseconds(lease_));
  return response;
}

absl::StatusOr<uint64_t> Membership::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(request.job_id());
  if (job == jobs_.end()) return NotAMember(request.job_id(), request.worker_id());
  for (Member& m : job->second.members) {
    if (m.info.worker_id() != request.worker_id()) continue;
    reachability_->Heard();
    absl::Time now = absl::Now();
    m.lease_expiry = now + lease_;
    m.disconnected = false;
    m.info.set_last_heartbeat_unix_ms(absl::ToUnixMillis(now));
    m.info.set_generation(request.generation());
    m.info.set_completed_step(request.completed_step());
    m.stopped_for = std::max(m.stopped_for, request.stopped_for());
    if (m.first_step < 0) m.first_step = request.completed_step();
    m.info.set_steps_taken(request.completed_step() - m.first_step);
    // Steps of workers that have not re-formed since the chunks moved were undone.
    if (request.generation() >= job->second.moved_in) {
      job->second.committed_step = std::max(job->second.committed_step, request.completed_step());
    }
    return job->second.generation.number();
  }
  return NotAMember(request.job_id(), request.worker_id());
}

Membership::Member* Membership::FindMember(const std::string& job_id,
                                           const std::string& worker_id) {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return nullptr;
  for (Member& m : job->second.members) {
    if (m.info.worker_id() == worker_id) return &m;
  }
  return nullptr;
}

void Membership::Watching(const std::string& job_id, const std::string& worker_id,
                          absl::Time opened) {
  absl::MutexLock lock(&mu_);
  Member* member = FindMember(job_id, worker_id);
  if (member == nullptr) return;
  reachability_->Heard();
  member->watching_since = std::max(member->watching_since, opened);
  member->lease_expiry = std::max(member->lease_expiry, absl::Now() + lease_);
  member->disconnected = false;
}

void Membership::Disconnected(const std::string& job_id, const std::string& worker_id,
                              absl::Time opened) {
  absl::MutexLock lock(&mu_);
  Member* member = FindMember(job_id, worker_id);
  if (stopping_ || member == nullptr || member->watching_since > opened ||
      member->info.joined_unix_ms() > absl::ToUnixMillis(opened)) {
    return;
  }
  // Cut off from everyone, a connection that breaks is the network's doing
  // (often the worker's side, given up during the silence, reset when the
  // link heals): the lease rule decides, with its grace after the silence.
  if (isolated_) return;
  member->lease_expiry = std::min(member->lease_expiry, absl::Now() + kReconnectGrace);
  member->disconnected = true;
  lease_cut_ = true;
}

absl::Status Membership::RemoveMember(const std::string& job_id, Job* job,
                                      const std::string& worker_id, const char* why) {
  auto it = std::find_if(job->members.begin(), job->members.end(),
                         [&](const Member& m) { return m.info.worker_id() == worker_id; });
  if (it == job->members.end()) return NotAMember(job_id, worker_id);
  RETURN_IF_ERROR(metadata_->Delete(MemberKey(job_id, worker_id)));
  job->members.erase(it);
  LogEventCat("coordinator", "job ", job_id, ": worker ", worker_id, " ", why);
  return MaybeOpenGeneration(job_id, job, /*changed=*/true);
}

absl::StatusOr<v1::Generation> Membership::Leave(const v1::LeaveJobRequest& request) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(request.job_id());
  if (job == jobs_.end()) return NotAMember(request.job_id(), request.worker_id());
  RETURN_IF_ERROR(RemoveMember(request.job_id(), &job->second, request.worker_id(), "left"));
  return job->second.generation;
}

absl::StatusOr<v1::Generation> Membership::Renew(const v1::RenewGenerationRequest& request) {
  if (request.reason().size() > kMaxRenewReasonBytes) {
    return absl::InvalidArgumentError(absl::StrCat("reason: ", request.reason().size(),
                                                   " bytes; at most ", kMaxRenewReasonBytes));
  }
  absl::MutexLock lock(&mu_);
  if (FindMember(request.job_id(), request.worker_id()) == nullptr) {
    return NotAMember(request.job_id(), request.worker_id());
  }
  Job& job = jobs_[request.job_id()];
  if (job.generation.number() == request.generation() && request.generation() > 0) {
    LogEventCat("coordinator", "job ", request.job_id(), ": worker ", request.worker_id(),
                " could not form generation ", request.generation(), " (", Quoted(request.reason()),
                "); opening the next");
    RETURN_IF_ERROR(MaybeOpenGeneration(request.job_id(), &job, /*changed=*/true));
  }
  return job.generation;
}

absl::Status Membership::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return absl::OkStatus();  // no worker ever joined
  if (const std::vector<Member>& members = job->second.members; !members.empty()) {
    std::string names;
    for (const Member& m : members) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", m.info.worker_id());
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' has ", members.size(), " worker(s) (", names,
                     "); they must leave, or their leases expire, first"));
  }
  RETURN_IF_ERROR(metadata_->Delete(absl::StrCat(kGenerationPrefix, job_id)));
  jobs_.erase(job);
  return absl::OkStatus();
}

void Membership::ExpireLeasesLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Every quarter lease, at the earliest expiry, or when one was cut short.
    const absl::Time now = absl::Now();
    absl::Time wake = now + lease_ / 4;
    for (const auto& [job_id, job] : jobs_) {
      for (const Member& m : job.members) wake = std::min(wake, m.lease_expiry);
    }
    // A failed removal waits; so do leases that run out while nobody is heard.
    wake = std::max(wake, now + (isolated_ ? lease_ / 4 : absl::Milliseconds(10)));
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || lease_cut_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), wake);
    lease_cut_ = false;
    if (stopping_) break;
    const absl::Time expired_before = absl::Now();
    if (isolated_ && reachability_->HeardAfter(isolated_since_)) EndIsolation(expired_before);
    for (auto& [job_id, job] : jobs_) {
      std::vector<std::pair<std::string, bool>> expired;  // worker, disconnected
      for (const Member& m : job.members) {
        if (m.lease_expiry >= expired_before) continue;
        // A closed stream is a sign of the network. A silent member is lost
        // only if some peer was heard well after its last sign of life; if
        // none was, every peer fell silent at once: this coordinator is the
        // one cut off.
        if (!m.disconnected && !reachability_->HeardAfter(m.lease_expiry - lease_ / 2)) {
          if (!isolated_) {
            isolated_ = true;
            isolated_since_ = expired_before;
            LogEventCat("coordinator",
                        "hears from no worker or shard server: expires no lease until it does "
                        "(its own network may be cut)");
          }
          continue;
        }
        expired.emplace_back(m.info.worker_id(), m.disconnected);
      }
      for (const auto& [worker_id, disconnected] : expired) {
        absl::Status s = RemoveMember(
            job_id, &job, worker_id,
            disconnected ? "closed its generation stream and opened none again (it ended)"
                         : "lost its lease");
        if (!s.ok()) {
          LogEventCat("coordinator", "job ", job_id, ": ", s.ToString());
        } else if (on_member_lost_) {
          on_member_lost_(job_id);
        }
      }
    }
  }
}

void Membership::EndIsolation(absl::Time now) {
  // The members were as cut off as this coordinator, and their connections
  // come back as slowly as they backed off (TCP retransmits): each has as
  // long again as the silence lasted, plus a lease, to renew its lease.
  const absl::Duration silence = now - isolated_since_;
  for (auto& [job_id, job] : jobs_) {
    for (Member& m : job.members) m.lease_expiry = std::max(m.lease_expiry, now + silence + lease_);
  }
  isolated_ = false;
  LogEventCat("coordinator", "hears from its peers again after ", absl::FormatDuration(silence),
              " of silence: every worker has ", absl::FormatDuration(silence + lease_),
              " to renew its lease");
}

absl::StatusOr<uint64_t> Membership::ChunksMoved(const std::string& job_id, uint64_t version,
                                                 int64_t step, bool at_step_boundary) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  job.committed_step = step;
  const bool cuts_boundary = job.generation.at_step_boundary() && !at_step_boundary;
  if (job.placement_version != version || cuts_boundary) {
    job.placement_version = version;
    if (job.generation.number() > 0) {
      LogEventCat("coordinator", "job ", job_id, ": chunks moved (placement ", version, "); ",
                  at_step_boundary ? "the workers stop at the end of the step under way"
                                   : absl::StrCat("the workers resume from step ", step));
      RETURN_IF_ERROR(MaybeOpenGeneration(job_id, &job, /*changed=*/true, at_step_boundary));
    }
    job.moved_in = std::max<uint64_t>(job.generation.number(), 1);
  }
  return job.moved_in;
}

bool Membership::AwaitStepBoundary(const std::string& job_id, uint64_t number) {
  absl::MutexLock lock(&mu_);
  const uint64_t ended = boundary_waits_ended_;
  bool current = true;
  auto stopped = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto job = jobs_.find(job_id);
    if (job == jobs_.end() || job->second.generation.number() == 0) return true;  // no step runs
    current = job->second.generation.number() == number && boundary_waits_ended_ == ended;
    if (stopping_ || !current) return true;
    for (const std::string& id : job->second.generation.worker_ids()) {
      const Member* member = FindMember(job_id, id);
      if (member == nullptr || member->stopped_for < number) return false;
    }
    return true;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&stopped), lease_) && current && !stopping_;
}

void Membership::EndStepBoundaryWaits() {
  absl::MutexLock lock(&mu_);
  ++boundary_waits_ended_;
}

uint64_t Membership::PlacementVersion(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  return job == jobs_.end() ? 0 : job->second.generation.placement_version();
}

void Membership::ListMembers(const std::string& job_id, v1::ListMembersResponse* response) const {
  absl::MutexLock lock(&mu_);
  response->set_lease_ms(absl::ToInt64Milliseconds(lease_));
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  const v1::Generation& generation = job->second.generation;
  *response->mutable_generation() = generation;
  response->set_world_size(generation.worker_ids_size());
  for (const Member& m : job->second.members) {
    v1::Member* out = response->add_members();
    *out = m.info;
    const auto& ids = generation.worker_ids();
    auto rank = std::find(ids.begin(), ids.end(), m.info.worker_id());
    out->set_in_generation(rank != ids.end());
    out->set_rank(rank != ids.end() ? static_cast<uint32_t>(rank - ids.begin()) : 0);
  }
}

void Membership::Summarize(const std::string& job_id, v1::JobSummary* summary) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  summary->set_num_members(job->second.members.size());
  summary->set_generation(job->second.generation.number());
  summary->set_committed_step(job->second.committed_step);
}

v1::Generation Membership::Subscribe(const std::string& job_id, Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  job.watchers.push_back(watcher);
  v1::Generation current = job.generation;
  current.set_job_id(job_id);
  return current;
}

void Membership::Unsubscribe(const std::string& job_id, Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  auto& watchers = job->second.watchers;
  watchers.erase(std::remove(watchers.begin(), watchers.end(), watcher), watchers.end());
}

}  // namespace strata
