#include "client/worker_membership.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
constexpr absl::Duration kWatchRetry = absl::Milliseconds(100);
// Generations kept for Running(): more than can pass while one forms.
constexpr size_t kRecentGenerations = 16;

bool Includes(const v1::Generation& generation, const std::string& worker_id) {
  const auto& ids = generation.worker_ids();
  return std::find(ids.begin(), ids.end(), worker_id) != ids.end();
}

std::string HostAndPid() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ":", getpid());
}

// How `newer` ends a step of `running`, if it does.
struct Interruption {
  bool chunks_moved = false;     // it carries another placement version
  bool members_changed = false;  // it lacks a member of `running`
  bool any() const { return chunks_moved || members_changed; }
};

Interruption Interrupts(const v1::Generation& newer, const v1::Generation& running) {
  Interruption interruption;
  if (running.number() == 0 || newer.number() <= running.number()) return interruption;
  interruption.chunks_moved =
      newer.placement_version() != running.placement_version() && !newer.at_step_boundary();
  for (const std::string& id : running.worker_ids()) {
    interruption.members_changed |= !Includes(newer, id);
  }
  return interruption;
}

}  // namespace

WorkerMembership::WorkerMembership(const std::string& coordinator_address,
                                   const ChannelCredentials& credentials, std::string job_id,
                                   std::string worker_id,
                                   std::function<void(uint64_t, bool)> on_interrupted)
    : job_id_(std::move(job_id)),
      worker_id_(std::move(worker_id)),
      on_interrupted_(std::move(on_interrupted)),
      stub_(v1::Coordinator::NewStub(MakeChannel(coordinator_address, credentials))) {}

absl::StatusOr<std::unique_ptr<WorkerMembership>> WorkerMembership::Join(
    const std::string& coordinator_address, const ChannelCredentials& credentials,
    const std::string& job_id, const std::string& worker_id,
    std::function<void(uint64_t, bool)> on_interrupted) {
  std::unique_ptr<WorkerMembership> membership(new WorkerMembership(
      coordinator_address, credentials, job_id, worker_id, std::move(on_interrupted)));
  RETURN_IF_ERROR(membership->SendJoin());
  membership->heartbeat_thread_ = std::thread([m = membership.get()] { m->HeartbeatLoop(); });
  membership->watch_thread_ = std::thread([m = membership.get()] { m->WatchLoop(); });
  return membership;
}

WorkerMembership::~WorkerMembership() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
}

absl::Status WorkerMembership::SendJoin() {
  v1::JoinJobRequest request;
  request.set_job_id(job_id_);
  request.set_worker_id(worker_id_);
  request.set_address(HostAndPid());
  v1::JoinJobResponse response;
  RETURN_IF_ERROR(
      CallUnary(stub_.get(), &v1::Coordinator::Stub::JoinJob, request, &response, kRpcTimeout));
  {
    absl::MutexLock lock(&mu_);
    lease_ = absl::Milliseconds(response.lease_ms());
  }
  Observe(response.generation());
  return absl::OkStatus();
}

void WorkerMembership::Observe(const v1::Generation& generation) {
  Interruption interruption;
  uint64_t running = 0;
  {
    absl::MutexLock lock(&mu_);
    if (generation.number() <= latest_.number()) return;
    latest_ = generation;
    recent_.push_back(generation);
    if (recent_.size() > kRecentGenerations) recent_.pop_front();
    if (generation.at_step_boundary() && !step_in_flight_) stopped_for_ = generation.number();
    running = running_.number();
    interruption = Interrupts(latest_, running_);
  }
  if (interruption.any() && on_interrupted_) {
    on_interrupted_(running, interruption.members_changed);
  }
}

v1::Generation WorkerMembership::Latest() const {
  absl::MutexLock lock(&mu_);
  return latest_;
}

absl::StatusOr<v1::Generation> WorkerMembership::WaitNewer(uint64_t than,
                                                           absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (latest_.number() > than && Includes(latest_, worker_id_));
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!ready() || stopping_) {
    return absl::DeadlineExceededError(
        absl::StrCat("job '", job_id_, "': no generation after ", than, " with worker ", worker_id_,
                     " formed in time (the newest is ", latest_.number(), " with ",
                     latest_.worker_ids_size(), " worker(s))"));
  }
  return latest_;
}

void WorkerMembership::Running(const v1::Generation& generation, int64_t completed_step) {
  Interruption interruption;
  {
    absl::MutexLock lock(&mu_);
    // A generation that ends this one may have been observed while this one
    // formed: Observe() judged it against the previous one.
    if (generation.number() != running_.number()) {
      for (const v1::Generation& newer : recent_) {
        const Interruption by = Interrupts(newer, generation);
        interruption.chunks_moved |= by.chunks_moved;
        interruption.members_changed |= by.members_changed;
      }
    }
    running_ = generation;
    completed_step_ = completed_step;
  }
  if (interruption.any() && on_interrupted_) {
    on_interrupted_(generation.number(), interruption.members_changed);
  }
}

void WorkerMembership::SetStepInFlight(bool in_flight) {
  absl::MutexLock lock(&mu_);
  step_in_flight_ = in_flight;
  if (!in_flight && latest_.at_step_boundary()) {
    stopped_for_ = std::max(stopped_for_, latest_.number());
  }
}

absl::StatusOr<v1::Generation> WorkerMembership::Leave() {
  {
    absl::MutexLock lock(&mu_);
    left_ = true;
  }
  v1::LeaveJobRequest request;
  request.set_job_id(job_id_);
  request.set_worker_id(worker_id_);
  v1::LeaveJobResponse response;
  RETURN_IF_ERROR(
      CallUnary(stub_.get(), &v1::Coordinator::Stub::LeaveJob, request, &response, kRpcTimeout));
  return response.generation();
}

absl::Status WorkerMembership::Renew(uint64_t number, absl::string_view reason) {
  v1::RenewGenerationRequest request;
  request.set_job_id(job_id_);
  request.set_worker_id(worker_id_);
  request.set_generation(number);
  request.set_reason(std::string(reason.substr(0, kMaxRenewReasonBytes)));
  v1::RenewGenerationResponse response;
  return CallUnary(stub_.get(), &v1::Coordinator::Stub::RenewGeneration, request, &response,
                   kRpcTimeout);
}

void WorkerMembership::HeartbeatLoop() {
  absl::MutexLock lock(&mu_);
  // Every lease / 3, and at once when this worker stopped for a generation.
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || stopped_for_ > stopped_for_sent_;
  };
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&due), lease_ / 3);
    stopped_for_sent_ = stopped_for_;
    if (stopping_ || left_) continue;
    v1::HeartbeatRequest request;
    request.set_job_id(job_id_);
    request.set_worker_id(worker_id_);
    request.set_generation(running_.number());
    request.set_completed_step(completed_step_);
    request.set_stopped_for(stopped_for_);
    mu_.Unlock();
    v1::HeartbeatResponse response;
    absl::Status s =
        CallUnary(stub_.get(), &v1::Coordinator::Stub::Heartbeat, request, &response, kRpcTimeout);
    // The lease ran out (a long pause): join again, as a new member. Other
    // errors (the coordinator restarting) are retried at the next beat.
    if (absl::IsFailedPrecondition(s)) SendJoin().IgnoreError();
    mu_.Lock();
  }
}

void WorkerMembership::WatchLoop() {
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    v1::WatchGenerationRequest request;
    request.set_job_id(job_id_);
    request.set_worker_id(worker_id_);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      request.set_known_generation(latest_.number());
      watch_context_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<v1::Generation>> reader =
        stub_->WatchGeneration(&context, request);
    v1::Generation generation;
    while (reader->Read(&generation)) Observe(generation);
    reader->Finish();
    absl::MutexLock lock(&mu_);
    watch_context_ = nullptr;
    // The coordinator restarted or the stream broke: watch again shortly.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kWatchRetry);
  }
}

}  // namespace strata
