#include "shard/chunk.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/adam.h"
#include "kernels/elementwise.h"
#include "shard/state_math.h"

namespace strata {

Chunk::Chunk(std::string job_id, uint32_t chunk_id, FlatRange range, DType dtype, AdamConfig adam,
             std::unique_ptr<ChunkState> state, Tier* host, Extent copy_extent,
             MetadataStore* metadata, int64_t applied_step, ChunkGroups groups)
    : job_id_(std::move(job_id)),
      chunk_id_(chunk_id),
      range_(range),
      dtype_(dtype),
      adam_(adam),
      groups_(std::move(groups)),
      host_(host),
      copy_extent_(copy_extent),
      copies_(host->Map(copy_extent)),
      metadata_(metadata),
      state_(std::move(state)),
      checkpoint_(state_->tier(), state_->shape()),
      applied_step_(applied_step) {}

absl::Status Chunk::CommitAndRelease(const StateView& view, int64_t step) {
  absl::Status committed = state_->Commit(view);
  if (committed.ok()) {
    // The record names the new slot: without it the step is not durable.
    committed = WriteRecordLocked(step);
    if (committed.ok()) {
      state_->Retire();
    } else {
      state_->Rollback();
    }
  }
  state_->Release(view);
  return committed;
}

absl::Status Chunk::RebuildCopy() {
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  CastFromFloat(checkpoint_.LiveView(view).p, dtype_, copy(applied_step()), range_.size());
  state_->Release(view);
  return absl::OkStatus();
}

std::string Chunk::PreviousCopy() const {
  absl::MutexLock lock(&mu_);
  if (!previous_copy_valid_ || applying_) return "";
  return std::string(CopyView(applied_step_ - 1, range_.begin, range_.size()));
}

absl::Status Chunk::RestorePreviousCopy(absl::string_view bytes) {
  const size_t want = range_.size() * DTypeSize(dtype_);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                                   ": a copy of ", bytes.size(), " bytes, not ",
                                                   want));
  }
  absl::MutexLock lock(&mu_);
  std::memcpy(copy(applied_step_ - 1), bytes.data(), want);
  previous_copy_valid_ = true;
  return absl::OkStatus();
}

Chunk::~Chunk() { host_->Free(copy_extent_); }

absl::string_view Chunk::CopyView(int64_t step, uint64_t begin, uint64_t n) const {
  size_t esize = DTypeSize(dtype_);
  return absl::string_view(
      reinterpret_cast<const char*>(copy(step)) + (begin - range_.begin) * esize, n * esize);
}

int64_t Chunk::applied_step() const {
  absl::MutexLock lock(&mu_);
  return applied_step_;
}

std::optional<PushRound> Chunk::applied_round() const {
  absl::MutexLock lock(&mu_);
  return applied_round_;
}

absl::Status Chunk::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

uint64_t Chunk::staged_params() const {
  absl::MutexLock lock(&mu_);
  return staged_params_;
}

void Chunk::AwaitSeed() {
  absl::MutexLock lock(&mu_);
  awaiting_seed_ = true;
}

bool Chunk::awaiting_seed() const {
  absl::MutexLock lock(&mu_);
  return awaiting_seed_;
}

absl::StatusOr<bool> Chunk::EnterRound(int64_t step, PushRound round,
                                       std::map<uint64_t, StagedPush>* superseded) {
  RETURN_IF_ERROR(lost_);
  if (awaiting_seed_) {
    return absl::AbortedError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                           " is a new copy that awaits its seed"));
  }
  if (step == applied_step_ || (applying_ && step == applied_step_ + 1)) return false;
  if (step != applied_step_ + 1) {
    return absl::AbortedError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ",
                                           applied_step_, "; step ", step, " is ",
                                           step < applied_step_ ? "old" : "future"));
  }
  if (round.generation < min_generation_) {
    return absl::AbortedError(absl::StrCat(
        "step ", step, " of generation ", round.generation, " to chunk ", chunk_id_, " of job ",
        job_id_, ": the chunk takes generation ", min_generation_, " on; re-form first"));
  }
  const bool has_round = !staged_.empty() || committed_.has_value();
  if (has_round && round < staged_round_) {
    return absl::AbortedError(absl::StrCat(
        "step ", step, " of generation ", round.generation, " attempt ", round.attempt,
        " to chunk ", chunk_id_, " of job ", job_id_, ": generation ", staged_round_.generation,
        " attempt ", staged_round_.attempt, " is pushing that step"));
  }
  if (has_round && !(round == staged_round_)) {
    superseded->swap(staged_);
    staged_params_ = 0;
    committed_.reset();
  }
  staged_round_ = round;
  return true;
}

absl::Status Chunk::CommitLocked(int64_t step, const StepScalars& scalars) {
  if (!scalars.group_lrs.empty() && scalars.group_lrs.size() != groups_.num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("group_lrs has ", scalars.group_lrs.size(),
                                                   " learning rates; job ", job_id_, " has ",
                                                   groups_.num_groups(), " parameter group(s)"));
  }
  StepScalars effective = scalars;
  effective.lr = scalars.lr.value_or(adam_.lr);
  if (committed_.has_value() &&
      (committed_->coef != effective.coef || committed_->lr != effective.lr ||
       committed_->group_lrs != effective.group_lrs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("coef ", effective.coef, " and lr ", *effective.lr, " differ from the coef ",
                     committed_->coef, " and lr ", *committed_->lr, " of step ", step,
                     " committed to chunk ", chunk_id_, " of job ", job_id_));
  }
  if (!committed_.has_value()) committed_ = effective;
  return absl::OkStatus();
}

bool Chunk::TakeReady() {
  applying_ = staged_params_ == range_.size() && committed_.has_value();
  return applying_;
}

void Chunk::EndSuperseded(std::map<uint64_t, StagedPush> superseded, int64_t step, PushRound by) {
  if (superseded.empty()) return;
  absl::Status replaced = absl::AbortedError(
      absl::StrCat("the push to chunk ", chunk_id_, " of job ", job_id_, " for step ", step,
                   " was replaced by generation ", by.generation, " attempt ", by.attempt, "'s"));
  for (auto& [b, push] : superseded) std::move(push.done)(replaced);
}

absl::StatusOr<bool> Chunk::Stage(int64_t step, PushRound round, uint64_t begin, uint64_t n,
                                  absl::Span<const absl::string_view> grads,
                                  std::optional<StepScalars> scalars, PushDone done) {
  ASSIGN_OR_RETURN(PushedGrads pushed,
                   PushedGrads::Cut(begin - range_.begin, n, DTypeSize(dtype_), grads));
  std::map<uint64_t, StagedPush> superseded;
  bool staged = false;
  absl::StatusOr<bool> ready = [&]() -> absl::StatusOr<bool> {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(bool open, EnterRound(step, round, &superseded));
    if (!open) return false;
    uint64_t end = begin + n;
    auto next = staged_.lower_bound(begin);
    bool already_staged = next != staged_.end() && next->first == begin && next->second.end == end;
    bool overlaps_next = next != staged_.end() && next->first < end;
    bool overlaps_prev = next != staged_.begin() && std::prev(next)->second.end > begin;
    if (!already_staged && (overlaps_next || overlaps_prev)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push of [", begin, ", ", end, ") for step ", step,
          " overlaps a range already pushed to chunk ", chunk_id_, " of job ", job_id_));
    }
    if (scalars.has_value()) RETURN_IF_ERROR(CommitLocked(step, *scalars));
    if (!already_staged) {
      staged_.emplace(begin, StagedPush{end, std::move(pushed), std::move(done)});
      staged_params_ += n;
      staged = true;
    }
    return TakeReady();
  }();
  EndSuperseded(std::move(superseded), step, round);
  // A retry: the step is applied, or this range is staged already.
  if (ready.ok() && !staged) std::move(done)(absl::OkStatus());
  return ready;
}

absl::StatusOr<bool> Chunk::Commit(int64_t step, PushRound round, const StepScalars& scalars) {
  std::map<uint64_t, StagedPush> superseded;
  absl::StatusOr<bool> ready = [&]() -> absl::StatusOr<bool> {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(bool open, EnterRound(step, round, &superseded));
    if (!open) return false;
    RETURN_IF_ERROR(CommitLocked(step, scalars));
    return TakeReady();
  }();
  EndSuperseded(std::move(superseded), step, round);
  return ready;
}

void Chunk::Apply() {
  int64_t step;
  StepScalars scalars;
  PushRound round;
  std::map<uint64_t, StagedPush> pushes;
  {
    absl::MutexLock lock(&mu_);
    step = applied_step_ + 1;
    scalars = *committed_;
    round = staged_round_;
    pushes.swap(staged_);
  }
  const std::optional<LossScaleState> loss_scale = scalars.loss_scale_after;
  std::vector<Waiter> ready;
  {
    absl::MutexLock state_lock(&state_mu_);
    const std::vector<ConstantsSpan> spans = SpanConstants(
        groups_, range_.size(), adam_, *scalars.lr, scalars.group_lrs, step, scalars.coef);
    // The copy of `step` takes the place of step - 2's, which no pull can
    // ask for while applying_.
    absl::Status updated = state_->updates_in_tier()
                               ? UpdateInTier(step, spans, pushes, copy(step))
                               : UpdateInMemory(step, spans, pushes, copy(step));
    if (!updated.ok()) {
      FailApply(std::move(pushes), updated);
      return;
    }
    std::shared_ptr<StepLog> log;
    {
      absl::MutexLock lock(&mu_);
      log = log_;
    }
    std::shared_ptr<const LoggedStep> logged =
        log != nullptr && log->status().ok() ? LogEntry(step, scalars, pushes) : nullptr;
    // Still under state_mu_: ReadState() sees the state and its step
    // together, and a log has every step after its since_step().
    absl::MutexLock lock(&mu_);
    if (logged != nullptr) log->Append(std::move(logged));
    applied_step_ = step;
    applied_round_ = round;
    loss_scales_[step & 1] = loss_scale;
    applying_ = false;
    applied_any_ = true;
    previous_copy_valid_ = true;
    staged_params_ = 0;
    committed_.reset();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->step == step) {
        ready.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [begin, push] : pushes) std::move(push.done)(absl::OkStatus());
  // The copy stays unchanged until every worker has pulled this step (the
  // next step needs all of them), so it is read without the lock.
  for (Waiter& w : ready) std::move(w.done)(absl::OkStatus(), step, CopyView(step, w.begin, w.n));
}

std::vector<GradRange> Chunk::GradRanges(const std::map<uint64_t, StagedPush>& pushes) const {
  std::vector<GradRange> grads;
  for (const auto& [begin, push] : pushes) {
    const std::vector<GradRange>& ranges = push.grads.ranges();
    grads.insert(grads.end(), ranges.begin(), ranges.end());
  }
  return grads;
}

absl::Status Chunk::UpdateInMemory(int64_t step, const std::vector<ConstantsSpan>& spans,
                                   const std::map<uint64_t, StagedPush>& pushes,
                                   std::byte* copy_out) {
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  const StateView in = checkpoint_.LiveView(view);
  if (CheckpointNeedsState(step - 1)) KeepCheckpointState(step - 1, in);
  const StateView out = UpdateTarget(view);
  // Straight from the pushes' bytes: the update gives the bits of one pass
  // over the chunk.
  ApplyAdamStep(state_->shape(), in, out, spans, GradRanges(pushes), dtype_, copy_out, range_.begin,
                step);
  RETURN_IF_ERROR(CommitAndRelease(view, step));
  checkpoint_.Updated(out);
  return absl::OkStatus();
}

absl::Status Chunk::UpdateInTier(int64_t step, const std::vector<ConstantsSpan>& spans,
                                 const std::map<uint64_t, StagedPush>& pushes,
                                 std::byte* copy_out) {
  if (CheckpointNeedsState(step - 1)) {
    absl::StatusOr<StateView> live = state_->Load();
    if (live.ok()) {
      KeepCheckpointState(step - 1, *live);
      state_->Release(*live);
    } else {
      DisarmLocked(live.status());  // training does not fail for a checkpoint
    }
  }
  return state_->Update(spans, GradRanges(pushes), copy_out, range_.begin, step);
}

void Chunk::FailApply(std::map<uint64_t, StagedPush> pushes, const absl::Status& status) {
  absl::Status error(status.code(), absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                                 ": step not applied: ", status.message()));
  std::vector<Waiter> waiting;
  {
    absl::MutexLock lock(&mu_);
    applying_ = false;
    previous_copy_valid_ = false;  // its buffer was being overwritten
    staged_params_ = 0;
    if (absl::IsDataLoss(status)) {
      lost_ = absl::UnavailableError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " lost its state (",
                       status.message(), "); the coordinator gives its job's copies elsewhere"));
      error = lost_;
      waiting.swap(waiters_);
    }
  }
  for (auto& [begin, push] : pushes) std::move(push.done)(error);
  for (Waiter& w : waiting) std::move(w.done)(error, w.step, {});
}

uint64_t Chunk::Pull(int64_t step, uint64_t begin, uint64_t n, PullDone done) {
  absl::MutexLock lock(&mu_);
  // While applying, the next step's copy takes the buffer of the step before.
  if (step == applied_step_ || (step == applied_step_ - 1 && previous_copy_valid_ && !applying_)) {
    std::move(done)(absl::OkStatus(), step, CopyView(step, begin, n));
    return 0;
  }
  if (step == applied_step_ + 1) {
    if (!lost_.ok()) {
      std::move(done)(lost_, applied_step_, {});
      return 0;
    }
    if (waiters_.size() >= kMaxWaitingPulls) {
      std::move(done)(absl::ResourceExhaustedError(absl::StrCat(
                          "chunk ", chunk_id_, " of job ", job_id_, " has ", waiters_.size(),
                          " pulls waiting for step ", step, " (the most it keeps); retry later")),
                      applied_step_, {});
      return 0;
    }
    waiters_.push_back(Waiter{++last_ticket_, step, begin, n, std::move(done)});
    return last_ticket_;
  }
  std::move(done)(absl::AbortedError(absl::StrCat(
                      "chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                      applying_ ? " and applying the next" : "", "; cannot pull step ", step,
                      step == applied_step_ - 1 ? " (its copy is not kept)" : "")),
                  applied_step_, {});
  return 0;
}

void Chunk::CancelPull(uint64_t ticket, const absl::Status& status) {
  std::optional<Waiter> cancelled;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it == waiters_.end()) return;
    cancelled = std::move(*it);
    waiters_.erase(it);
  }
  std::move(cancelled->done)(status, cancelled->step, {});
}

size_t Chunk::waiting_pulls() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

absl::StatusOr<int64_t> Chunk::Fence(uint64_t generation, absl::Time deadline) {
  std::map<uint64_t, StagedPush> superseded;
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    min_generation_ = std::max(min_generation_, generation);
    const bool has_round = !staged_.empty() || committed_.has_value();
    if (!applying_ && has_round && staged_round_.generation < generation) {
      superseded.swap(staged_);
      staged_params_ = 0;
      committed_.reset();
    }
    step = applied_step_ + 1;
    const absl::Condition idle(
        +[](bool* applying) { return !*applying; }, &applying_);
    if (!mu_.AwaitWithDeadline(idle, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is still applying step ", step));
    }
    step = applied_step_;
  }
  EndSuperseded(std::move(superseded), step + 1, PushRound{generation, 0});
  return step;
}

void Chunk::FailWaiters(const absl::Status& status) {
  std::vector<Waiter> failed;
  std::map<uint64_t, StagedPush> pushes;
  {
    absl::MutexLock lock(&mu_);
    failed.swap(waiters_);
    if (!applying_) {
      pushes.swap(staged_);
      staged_params_ = 0;
    }
  }
  for (auto& [begin, push] : pushes) std::move(push.done)(status);
  for (Waiter& w : failed) std::move(w.done)(status, w.step, {});
}

}  // namespace strata
