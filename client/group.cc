// ClientImpl (client_impl.h): forming the group of each generation --
// rendezvous, rank and slice, the step every chunk has applied, the loss
// scale and the parameters -- and following newer generations and placements.

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "client/generation_agreement.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/rendezvous_keys.h"

namespace strata {

absl::StatusOr<std::pair<int64_t, int64_t>> ClientImpl::AppliedSteps(bool while_moving) {
  v1::GetPlacementRequest request;
  request.set_job_id(options_.job_id);
  v1::GetPlacementResponse placement;
  RETURN_IF_ERROR(CallUnary(coordinator_.get(), &v1::Coordinator::Stub::GetPlacement, request,
                            &placement, kControlRpcTimeout));
  if (placement.moving() && !while_moving) {
    return absl::UnavailableError(
        absl::StrCat("job '", options_.job_id, "' has chunks moving to a new placement"));
  }
  int64_t lowest = std::numeric_limits<int64_t>::max(), highest = 0;
  for (const v1::PlacementRow& row : placement.rows()) {
    if (row.applied_step() < 0) {
      return absl::UnavailableError(absl::StrCat("chunk ", row.chunk_id(), " on shard server ",
                                                 row.server_address(), " is ", row.tier()));
    }
    lowest = std::min(lowest, row.applied_step());
    highest = std::max(highest, row.applied_step());
  }
  if (placement.rows().empty()) lowest = 0;
  if (highest > lowest + 1) {
    return absl::InternalError(absl::StrCat("job '", options_.job_id, "' has chunks at step ",
                                            lowest, " and at step ", highest));
  }
  return std::make_pair(lowest, highest);
}

namespace {

// The longest a worker waits between asks for a moved job's placement.
constexpr absl::Duration kMaxPlacementPoll = absl::Milliseconds(100);
// How long a worker told of a newer generation (by a peer, or by a server
// whose fence cut its step) waits to hear of it itself, in each round of
// the group's agreement on it (generation_agreement.h).
constexpr absl::Duration kHearNewer = absl::Seconds(2);

// Sleeps `*backoff` and doubles it (up to 1 s); false, without sleeping,
// when the sleep would end past `deadline`.
bool BackOff(absl::Duration* backoff, absl::Time deadline) {
  if (absl::Now() + *backoff > deadline) return false;
  absl::SleepFor(*backoff);
  *backoff = std::min(*backoff * 2, absl::Seconds(1));
  return true;
}

}  // namespace

absl::StatusOr<std::pair<int64_t, int64_t>> ClientImpl::AppliedStepsOnceKnown(absl::Time deadline) {
  for (absl::Duration backoff = absl::Milliseconds(20);;) {
    absl::StatusOr<std::pair<int64_t, int64_t>> steps = AppliedSteps();
    if (steps.ok() || !absl::IsUnavailable(steps.status()) ||
        membership_->Latest().number() > generation_.number() || !BackOff(&backoff, deadline)) {
      return steps;
    }
  }
}

absl::Status ClientImpl::Reform(uint64_t than) {
  // Their buffers and group are about to change; the parameters are pulled again.
  DropStream();
  FinishParamStream().IgnoreError();
  const absl::Time started = absl::Now();
  const absl::Time deadline = started + options_.rendezvous_timeout;
  while (true) {
    absl::Status formed = ReformOnce(&than, started, deadline);
    if (formed.ok() || !IsRetryable(formed) || absl::Now() > deadline) return formed;
    LogEventCat("client", "job ", options_.job_id, ": generation ", than,
                " broke while re-forming (", formed.message(), "); re-forming in the next");
    // Where no membership change opens one (a peer gave up, the coordinator
    // restarted during the rendezvous), the coordinator opens it: asked
    // until it answers (it may be restarting).
    for (absl::Duration backoff = absl::Milliseconds(20);
         !membership_->Renew(than, formed.message()).ok() && BackOff(&backoff, deadline);) {
    }
  }
}

absl::Status ClientImpl::ReformOnce(uint64_t* than, absl::Time started, absl::Time deadline) {
  SetCollective(nullptr, 0);
  ASSIGN_OR_RETURN(v1::Generation generation, membership_->WaitNewer(*than, deadline));
  *than = generation.number();
  const auto& ids = generation.worker_ids();
  CollectiveOptions collective;
  collective.coordinator_address = options_.coordinator_address;
  collective.coordinator_credentials = credentials_;
  collective.key_prefix = GenerationRendezvousPrefix(options_.job_id, generation.number());
  collective.rank = static_cast<int>(std::find(ids.begin(), ids.end(), worker_id_) - ids.begin());
  collective.size = ids.size();
  collective.hostname = options_.collective_hostname;
  collective.cuda_device = device_->cuda_ordinal();
  collective.timeout = options_.collective_timeout;
  // A member that never comes (lost before it formed) leads to the next one.
  collective.abandon = [this, number = generation.number()] {
    return membership_->Latest().number() > number;
  };
  absl::StatusOr<std::unique_ptr<Collective>> formed = options_.collective == "nccl"
                                                           ? CreateNcclCollective(collective)
                                                           : CreateGlooCollective(collective);
  RETURN_IF_ERROR(formed.status());
  SetCollective(*std::move(formed), generation.number());
  // From now on a generation that drops a member of this one, or moves the
  // chunks, aborts what follows.
  membership_->Running(generation, step_);
  generation_ = generation;
  reform_agreed_ = false;
  rank_ = collective.rank;
  world_size_ = collective.size;
  if (generation_.placement_version() != transport_.job().placement_version()) {
    RETURN_IF_ERROR(FollowPlacement(generation_.placement_version(), deadline));
  }
  RETURN_IF_ERROR(CutBuffers());
  ASSIGN_OR_RETURN(const int64_t step, AgreeOnStep(deadline));
  RETURN_IF_ERROR(collective_->Barrier());
  const absl::Time pull_started = absl::Now();
  RETURN_IF_ERROR(PushPull(step, /*push=*/nullptr));
  if (!on_demand()) {
    RETURN_IF_ERROR(collective_->AllGather(options_.job.dtype, params_.data(), padded_num_params_));
  }
  const absl::Time done = absl::Now();
  reform_stats_.count++;
  reform_stats_.generation = generation_.number();
  reform_stats_.seconds = absl::ToDoubleSeconds(done - started);
  reform_stats_.param_pull_seconds = absl::ToDoubleSeconds(done - pull_started);
  reform_stats_.steps_lost = std::max<int64_t>(step_ - step, 0);
  step_ = step;
  broken_ = false;
  membership_->Running(generation_, step_);
  return absl::OkStatus();
}

absl::Status ClientImpl::CutBuffers() {
  padded_num_params_ = layout_.PaddedNumParams(world_size_);
  const FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
  params_base_ = on_demand() ? slice.begin : 0;
  // The slice is pulled and the rest gathered: no value is kept.
  const uint64_t params_bytes = (on_demand() ? slice.size() : padded_num_params_) * esize_;
  if (params_.size() != params_bytes) {
    params_.Reset();
    ASSIGN_OR_RETURN(params_, device_->Allocate(params_bytes));
  }
  pulled_.Reset();
  if (!device_->is_host()) {
    ASSIGN_OR_RETURN(pulled_, device_->AllocateHost(slice.size() * esize_));
  }
  buckets_ = Buckets(padded_num_params_, options_.bucket_num_params);
  // Accumulated gradients keep their flat positions in the new world's buffer.
  RETURN_IF_ERROR(grads_.Reset(buckets_, slice, esize_));
  CutSlicePieces();
  return absl::OkStatus();
}

void ClientImpl::CutSlicePieces() {
  const FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
  slice_pieces_.clear();
  for (size_t i = buckets_.BucketOf(slice.begin); !slice.empty() && i < buckets_.size(); ++i) {
    FlatRange part = Intersect(buckets_.bucket(i), slice);
    if (part.empty()) break;
    for (Piece& piece : transport_.PiecesOf(part, kMaxPayloadBytes / esize_)) {
      slice_pieces_.push_back(std::move(piece));
    }
  }
}

absl::StatusOr<int64_t> ClientImpl::AgreeOnStep(absl::Time deadline) {
  // One all-reduce carries two agreements: rank 0 decides the step (and
  // whether the job is fresh), the others add zeros -- a broadcast -- and
  // the workers that ran steps give the loss scaler: they saw the same
  // overflows, so the sum of their scalers over their count is that scaler.
  // A broadcast from rank 0 alone would lose it where rank 0 has none: a
  // worker that restarted under its id within its lease keeps its rank.
  // state = {step, step is fresh, loss scale, good steps, scaler known}
  double state[5] = {0, 0, 0, 0, 0};
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(auto steps, AppliedStepsOnceKnown(deadline));
    // A job restored from a checkpoint has its state already.
    const bool fresh = steps.second == 0 && transport_.job().restored_from().empty();
    if (fresh && !options_.initial.safetensors_path.empty()) {
      RETURN_IF_ERROR(WriteInitialState());
      ASSIGN_OR_RETURN(steps, AppliedSteps());
    }
    state[0] = static_cast<double>(steps.first);
    state[1] = fresh ? 1 : 0;
  }
  if (scaler_known_) {
    state[2] = scaler_.scale();
    state[3] = scaler_.good_steps();
    state[4] = 1;
  }
  RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(state)));
  int64_t step = static_cast<int64_t>(state[0]);
  // Workers that ran steps agree on the scale (they saw the same overflows).
  if (state[4] > 0) scaler_.Restore(state[2] / state[4], static_cast<int>(state[3] / state[4]));
  // At the step of the checkpoint the job started or resumed from: its scaler.
  if (transport_.job().has_restored_loss_scale() && step == transport_.job().restored_step()) {
    scaler_.Restore(transport_.job().restored_loss_scale().scale(),
                    transport_.job().restored_loss_scale().good_steps());
  }
  scaler_known_ = true;
  if (state[1] > 0 && rank_ == 0 && !options_.initial.params.empty()) {
    RETURN_IF_ERROR(WriteInitialParams());
  }
  return step;
}

absl::Status ClientImpl::FollowPlacement(uint64_t version, absl::Time deadline) {
  v1::GetJobRequest request;
  request.set_job_id(options_.job_id);
  // The coordinator announces a move before it has finished it: asked
  // again soon (a move's pause is a fraction of a second), then less often.
  for (absl::Duration wait = absl::Milliseconds(5);; wait = std::min(2 * wait, kMaxPlacementPoll)) {
    v1::JobInfo job;
    RETURN_IF_ERROR(CallUnary(coordinator_.get(), &v1::Coordinator::Stub::GetJob, request, &job,
                              kControlRpcTimeout));
    if (job.placement_version() >= version) {
      RETURN_IF_ERROR(transport_.SetPlacement(std::move(job)));
      break;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job '", options_.job_id, "': its chunks did not finish moving (placement ",
                       version, ") within the rendezvous timeout"));
    }
    absl::SleepFor(wait);
  }
  LogEventCat("client", "job ", options_.job_id, ": chunks moved (placement ",
              transport_.job().placement_version(), "), resuming from checkpoint ",
              transport_.job().restored_from());
  return absl::OkStatus();
}

absl::StatusOr<bool> ClientImpl::FollowInPlace(bool in_step) {
  const absl::Time deadline = absl::Now() + options_.rendezvous_timeout;
  ASSIGN_OR_RETURN(
      const std::optional<v1::Generation> agreed,
      AgreeOnNewestGeneration(
          generation_.number(), world_size_, kHearNewer, deadline,
          [this] { return membership_->Latest(); },
          [this](uint64_t number, absl::Time until) {
            membership_->WaitNewer(number - 1, until).IgnoreError();
          },
          [this](absl::Span<double> values) { return collective_->AllReduceSum(values); }));
  if (!agreed.has_value()) {
    LogEventCat("client", "job ", options_.job_id, ": the workers heard of different generations",
                " after generation ", generation_.number(), "; the group re-forms");
    return false;
  }
  const v1::Generation& latest = *agreed;
  const auto& ids = latest.worker_ids();
  // A newer generation of the same members that moved chunks; one that did
  // not was opened for a group that could not form (RenewGeneration).
  bool follows = step_ > 0 && latest.number() > generation_.number() &&
                 latest.placement_version() != generation_.placement_version() &&
                 std::equal(ids.begin(), ids.end(), generation_.worker_ids().begin(),
                            generation_.worker_ids().end());
  if (follows && rank_ == 0) {
    // Every chunk must hold the step the group is at, or (mid-step) the
    // next: copies moved, none taken back to a checkpoint.
    absl::Status checked = FollowPlacement(latest.placement_version(), deadline);
    absl::StatusOr<std::pair<int64_t, int64_t>> steps =
        checked.ok() ? AppliedSteps(/*while_moving=*/true) : checked;
    follows = steps.ok() && steps->first >= step_ && steps->second <= step_ + (in_step ? 1 : 0);
    if (!follows) {
      LogEventCat("client", "job ", options_.job_id, ": generation ", latest.number(),
                  " is re-formed: ",
                  steps.ok() ? absl::StrCat("its chunks are at steps ", steps->first, "..",
                                            steps->second, ", the group at ", step_)
                             : steps.status().ToString());
    }
  }
  // All or none: every worker found it followable, and rank 0 its chunks
  // where the group is.
  double following = follows ? 1.0 : 0.0;
  RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(&following, 1)));
  if (following != static_cast<double>(world_size_)) return false;
  if (rank_ != 0) RETURN_IF_ERROR(FollowPlacement(latest.placement_version(), deadline));
  CutSlicePieces();
  {
    absl::MutexLock lock(&collective_mu_);
    collective_generation_ = latest.number();
  }
  generation_ = latest;
  reform_agreed_ = false;
  membership_->Running(generation_, step_);
  LogEventCat("client", "job ", options_.job_id, ": generation ", generation_.number(),
              " moved chunks (placement ", generation_.placement_version(), "); the group goes on",
              in_step ? absl::StrCat(" with step ", step_ + 1) : std::string());
  return true;
}

absl::Status ClientImpl::FollowGeneration() {
  // An all-gather that failed leaves parameters to pull again.
  if (!FinishParamStream().ok()) broken_ = true;
  if (broken_) return Recover(absl::UnavailableError("the last step failed"));
  if (!reform_agreed_) return absl::OkStatus();
  // A generation newer than the group's is open (or opens once a worker
  // that announced its leave has left): followed in place where it only
  // moved chunks, else re-formed.
  absl::StatusOr<bool> followed = FollowInPlace(/*in_step=*/false);
  if (followed.ok() && *followed) return absl::OkStatus();
  return Reform(generation_.number());
}

absl::Status ClientImpl::Recover(const absl::Status& error) {
  broken_ = true;
  absl::Status reformed = Reform(generation_.number());
  if (!reformed.ok()) {
    return absl::Status(reformed.code(),
                        absl::StrCat(reformed.message(), " (after: ", error.message(), ")"));
  }
  return reformed;
}

void ClientImpl::CancelInFlight(uint64_t generation, bool members_changed) {
  transport_.CancelGeneration(generation);
  if (!members_changed) return;
  absl::MutexLock lock(&collective_mu_);
  if (collective_ != nullptr && collective_generation_ == generation) collective_->Abort();
}

void ClientImpl::SetCollective(std::unique_ptr<Collective> collective, uint64_t generation) {
  absl::MutexLock lock(&collective_mu_);
  collective_ = std::move(collective);
  collective_generation_ = generation;
}

}  // namespace strata
