#include "server/chunk.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/adam.h"
#include "kernels/elementwise.h"
#include "server/saved_chunk.h"

namespace strata {

uint64_t Chunk::CopyBytes(uint64_t num_params, DType dtype) {
  return 2 * num_params * DTypeSize(dtype);
}

uint64_t Chunk::NumBytes(uint64_t num_params, DType dtype) {
  return num_params * 3 * sizeof(float) + CopyBytes(num_params, dtype);
}

Chunk::Chunk(std::string job_id, uint32_t chunk_id, FlatRange range, DType dtype, AdamConfig adam,
             std::unique_ptr<ChunkState> state, Tier* host, Extent copy_extent,
             MetadataStore* metadata, int64_t applied_step)
    : job_id_(std::move(job_id)),
      chunk_id_(chunk_id),
      range_(range),
      dtype_(dtype),
      adam_(adam),
      host_(host),
      copy_extent_(copy_extent),
      copies_(host->Map(copy_extent)),
      metadata_(metadata),
      state_(std::move(state)),
      applied_step_(applied_step) {}

std::string Chunk::RecordPrefix(const std::string& job_id) {
  return absl::StrCat("chunk/", job_id, "/");
}

std::string Chunk::RecordKey(const std::string& job_id, uint32_t chunk_id) {
  return absl::StrCat(RecordPrefix(job_id), absl::Dec(chunk_id, absl::kZeroPad8));
}

absl::Status Chunk::WriteRecordLocked(int64_t step) {
  if (metadata_ == nullptr || !state_->durable()) return absl::OkStatus();
  v1::ChunkRecord record;
  record.mutable_chunk()->set_chunk_id(chunk_id_);
  record.mutable_chunk()->set_flat_begin(range_.begin);
  record.mutable_chunk()->set_num_params(range_.size());
  RETURN_IF_ERROR(state_->Describe(&record));
  record.set_applied_step(step);
  return metadata_->Put(RecordKey(job_id_, chunk_id_), record.SerializeAsString(), /*sync=*/true);
}

absl::Status Chunk::WriteRecord() {
  absl::MutexLock state_lock(&state_mu_);
  return WriteRecordLocked(applied_step());
}

absl::Status Chunk::RebuildCopy() {
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  CastFromFloat(view.p, dtype_, copy(applied_step()), range_.size());
  state_->Release(view);
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

uint64_t Chunk::staged_params() const {
  absl::MutexLock lock(&mu_);
  return staged_params_;
}

absl::StatusOr<bool> Chunk::Stage(int64_t step, uint64_t generation, uint64_t begin, uint64_t n,
                                  absl::string_view grads, StepScalars scalars, PushDone done) {
  const float lr = scalars.lr.value_or(adam_.lr);
  std::map<uint64_t, StagedPush> superseded;
  bool staged = false;
  bool complete = false;
  {
    absl::MutexLock lock(&mu_);
    bool applied = step == applied_step_ || (applying_ && step == applied_step_ + 1);
    if (!applied && step != applied_step_ + 1) {
      return absl::AbortedError(absl::StrCat(
          "chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
          "; a push for step ", step, " is ", step < applied_step_ ? "old" : "future"));
    }
    if (!applied && !staged_.empty() && generation != staged_generation_) {
      if (generation < staged_generation_) {
        return absl::AbortedError(absl::StrCat(
            "push of generation ", generation, " for step ", step, " to chunk ", chunk_id_,
            " of job ", job_id_, ": generation ", staged_generation_, " is pushing that step"));
      }
      superseded.swap(staged_);
      staged_params_ = 0;
    }
    uint64_t end = begin + n;
    auto next = staged_.lower_bound(begin);
    bool already_staged = next != staged_.end() && next->first == begin && next->second.end == end;
    if (!applied && !already_staged) {
      bool overlaps_next = next != staged_.end() && next->first < end;
      bool overlaps_prev = next != staged_.begin() && std::prev(next)->second.end > begin;
      if (overlaps_next || overlaps_prev) {
        return absl::InvalidArgumentError(absl::StrCat(
            "push of [", begin, ", ", end, ") for step ", step,
            " overlaps a range already pushed to chunk ", chunk_id_, " of job ", job_id_));
      }
      if (!staged_.empty() && (scalars.coef != staged_coef_ || lr != staged_lr_)) {
        return absl::InvalidArgumentError(
            absl::StrCat("coef ", scalars.coef, " and lr ", lr, " differ from the coef ",
                         staged_coef_, " and lr ", staged_lr_, " of other pushes of step ", step,
                         " to chunk ", chunk_id_, " of job ", job_id_));
      }
      staged_.emplace(begin, StagedPush{end, grads, std::move(done)});
      staged_params_ += n;
      staged_coef_ = scalars.coef;
      staged_lr_ = lr;
      staged_loss_scale_ = scalars.loss_scale_after;
      staged_generation_ = generation;
      staged = true;
      complete = staged_params_ == range_.size();
      applying_ = complete;
    }
  }
  absl::Status replaced = absl::AbortedError(
      absl::StrCat("the push to chunk ", chunk_id_, " of job ", job_id_, " for step ", step,
                   " was replaced by generation ", generation, "'s"));
  for (auto& [b, push] : superseded) std::move(push.done)(replaced);
  // A retry: the step is applied, or this range is staged already.
  if (!staged) std::move(done)(absl::OkStatus());
  return complete;
}

void Chunk::Apply() {
  int64_t step;
  float coef;
  AdamConfig adam = adam_;
  std::optional<v1::LossScaleState> loss_scale;
  std::map<uint64_t, StagedPush> pushes;
  {
    absl::MutexLock lock(&mu_);
    step = applied_step_ + 1;
    coef = staged_coef_;
    adam.lr = staged_lr_;
    loss_scale = staged_loss_scale_;
    pushes.swap(staged_);
  }
  std::vector<Waiter> ready;
  {
    absl::MutexLock state_lock(&state_mu_);
    absl::StatusOr<StateView> view = state_->Load();
    if (!view.ok()) {
      FailApply(std::move(pushes), view.status());
      return;
    }
    KeepCheckpointState(step - 1, *view);
    // One pass per push, straight from its bytes: the update is elementwise,
    // so this gives the bits of one pass over the chunk.
    const AdamConstants constants = MakeAdamConstants(adam, step, coef);
    const size_t esize = DTypeSize(dtype_);
    // The copy of `step` takes the place of step - 2's, which no pull can
    // ask for while applying_.
    std::byte* copy_out = copy(step);
    for (const auto& [begin, push] : pushes) {
      uint64_t offset = begin - range_.begin;
      AdamUpdate(constants, dtype_, push.grads.data(), view->p + offset, view->m + offset,
                 view->v + offset, dtype_, copy_out + offset * esize, push.end - begin);
    }
    absl::Status committed = state_->Commit(*view);
    if (committed.ok()) {
      // The record names the new slot: without it the step is not durable.
      committed = WriteRecordLocked(step);
      if (!committed.ok()) state_->Rollback();
    }
    state_->Release(*view);
    if (!committed.ok()) {
      FailApply(std::move(pushes), committed);
      return;
    }
    // Still under state_mu_: ReadState() sees the state and its step together.
    absl::MutexLock lock(&mu_);
    applied_step_ = step;
    loss_scales_[step & 1] = loss_scale;
    applying_ = false;
    applied_any_ = true;
    previous_copy_valid_ = true;
    staged_params_ = 0;
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

void Chunk::FailApply(std::map<uint64_t, StagedPush> pushes, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    applying_ = false;
    previous_copy_valid_ = false;  // its buffer was being overwritten
    staged_params_ = 0;
  }
  absl::Status error(status.code(), absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                                 ": step not applied: ", status.message()));
  for (auto& [begin, push] : pushes) std::move(push.done)(error);
}

void Chunk::Pull(int64_t step, uint64_t begin, uint64_t n, PullDone done) {
  absl::MutexLock lock(&mu_);
  // While applying, the next step's copy takes the buffer of the step before.
  if (step == applied_step_ || (step == applied_step_ - 1 && previous_copy_valid_ && !applying_)) {
    std::move(done)(absl::OkStatus(), step, CopyView(step, begin, n));
    return;
  }
  if (step == applied_step_ + 1) {
    waiters_.push_back(Waiter{step, begin, n, std::move(done)});
    return;
  }
  std::move(done)(absl::AbortedError(absl::StrCat(
                      "chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                      applying_ ? " and applying the next" : "", "; cannot pull step ", step,
                      step == applied_step_ - 1 ? " (its copy is not kept)" : "")),
                  applied_step_, {});
}

absl::Status Chunk::WriteParams(uint64_t begin, const float* params, uint64_t n) {
  {
    absl::MutexLock lock(&mu_);
    if (applied_step_ != 0 || applying_ || !staged_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                       "; parameters can be written only before the first step"));
    }
  }
  return WriteAndCommit(begin, n, /*step=*/0, params, [&](const StateView& view, uint64_t offset) {
    std::memcpy(view.p + offset, params, n * sizeof(float));
  });
}

absl::Status Chunk::WriteAndCommit(uint64_t begin, uint64_t n, int64_t step, const float* params,
                                   absl::FunctionRef<void(const StateView&, uint64_t)> write) {
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  uint64_t offset = begin - range_.begin;
  write(view, offset);
  absl::Status committed = state_->Commit(view);
  if (committed.ok()) {
    committed = WriteRecordLocked(step);
    if (!committed.ok()) state_->Rollback();
  }
  state_->Release(view);
  RETURN_IF_ERROR(committed);
  CastFromFloat(params, dtype_, copy(step) + offset * DTypeSize(dtype_), n);
  return absl::OkStatus();
}

absl::Status Chunk::WriteState(uint64_t begin, const float* p, const float* m, const float* v,
                               uint64_t n, int64_t step) {
  {
    absl::MutexLock lock(&mu_);
    if (applied_any_ || applying_ || !staged_.empty() ||
        (applied_step_ != 0 && applied_step_ != step)) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                       applied_any_ || !staged_.empty() ? " and has been pushed to" : "",
                       "; its state can be written only before the first push, at one step"));
    }
    applied_step_ = step;
    previous_copy_valid_ = false;
  }
  return WriteAndCommit(begin, n, step, p, [&](const StateView& view, uint64_t offset) {
    std::memcpy(view.p + offset, p, n * sizeof(float));
    std::memcpy(view.m + offset, m, n * sizeof(float));
    std::memcpy(view.v + offset, v, n * sizeof(float));
  });
}

absl::StatusOr<int64_t> Chunk::ReadState(uint64_t begin, uint64_t n, float* p_out, float* m_out,
                                         float* v_out) {
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  uint64_t offset = begin - range_.begin;
  std::memcpy(p_out, view.p + offset, n * sizeof(float));
  std::memcpy(m_out, view.m + offset, n * sizeof(float));
  std::memcpy(v_out, view.v + offset, n * sizeof(float));
  state_->Release(view);
  return applied_step();
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

absl::Status Chunk::ArmCheckpoint(int64_t step, BlockPool* blocks) {
  // Under state_mu_, no Apply() is between its check of the armed step and
  // its update: it applied before (and the chunk is past `step`) or will see it.
  absl::MutexLock state_lock(&state_mu_);
  absl::MutexLock lock(&mu_);
  if (applied_step_ > step) {
    return absl::AbortedError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ",
                                           applied_step_, ", past the checkpoint's step ", step));
  }
  if (checkpoint_step_ >= 0 && checkpoint_step_ != step) {
    return absl::FailedPreconditionError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                                      " is saving step ", checkpoint_step_,
                                                      " to a checkpoint"));
  }
  checkpoint_step_ = step;
  checkpoint_failure_ = absl::OkStatus();
  checkpoint_blocks_ = blocks;
  return absl::OkStatus();
}

void Chunk::KeepCheckpointState(int64_t step, const StateView& view) {
  {
    absl::MutexLock lock(&mu_);
    if (checkpoint_step_ != step || !checkpoint_state_.empty()) return;
    checkpoint_loss_scale_ = loss_scales_[step & 1];
  }
  absl::StatusOr<BlockedState> state = CopyStateLocked(view);
  if (state.ok()) {
    checkpoint_state_ = *std::move(state);
    return;
  }
  absl::MutexLock lock(&mu_);
  checkpoint_step_ = -1;
  checkpoint_failure_ = state.status();
}

absl::StatusOr<BlockedState> Chunk::CopyStateLocked(const StateView& view) {
  BlockedState state = std::move(checkpoint_buffer_);
  if (state.empty()) {
    ASSIGN_OR_RETURN(state, BlockedState::Take(checkpoint_blocks_, range_.size()));
  }
  state.CopyFrom(view);
  return state;
}

void Chunk::ReserveCheckpointBuffer() {
  // Whether a buffer is wanted: armed, on the host tier, without one.
  auto wanted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    absl::MutexLock lock(&mu_);
    return checkpoint_step_ >= 0 && state_->tier() == TierKind::kHost &&
           checkpoint_state_.empty() && checkpoint_buffer_.empty();
  };
  BlockPool* blocks;
  {
    absl::MutexLock state_lock(&state_mu_);
    if (!wanted()) return;
    blocks = checkpoint_blocks_;
  }
  // Without blocks, the copy takes them (and reports the failure) itself.
  absl::StatusOr<BlockedState> buffer = BlockedState::Take(blocks, range_.size());
  absl::MutexLock state_lock(&state_mu_);
  if (buffer.ok() && wanted()) checkpoint_buffer_ = *std::move(buffer);
}

absl::Status Chunk::AwaitCheckpointStep(absl::Time wait_until) {
  absl::MutexLock lock(&mu_);
  const int64_t step = checkpoint_step_;
  if (step < 0) {
    if (!checkpoint_failure_.ok()) return checkpoint_failure_;
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is not armed for a checkpoint"));
  }
  auto reached = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return applied_step_ >= step || checkpoint_step_ != step;
  };
  mu_.AwaitWithDeadline(absl::Condition(&reached), wait_until);
  if (checkpoint_step_ != step) {
    return absl::CancelledError(
        absl::StrCat("the checkpoint of chunk ", chunk_id_, " of job ", job_id_, " was cancelled"));
  }
  if (applied_step_ < step) {
    checkpoint_step_ = -1;
    return absl::DeadlineExceededError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                     " and did not reach the checkpoint's step ", step, " in time"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Chunk::SaveCheckpoint(const std::string& path,
                                               std::optional<v1::LossScaleState>* loss_scale) {
  RETURN_IF_ERROR(AwaitCheckpointStep(absl::InfinitePast()));
  ReserveCheckpointBuffer();
  // The state of `step`: the copy an Apply() made, or one made now (an
  // Apply() waits for a copy, not for the write).
  BlockedState state;
  {
    absl::MutexLock state_lock(&state_mu_);
    state = std::move(checkpoint_state_);
    {
      // Kept aside by an Apply() of the next step, or the applied step's
      // (no Apply() runs while state_mu_ is held).
      absl::MutexLock lock(&mu_);
      *loss_scale = !state.empty() ? checkpoint_loss_scale_ : loss_scales_[applied_step_ & 1];
    }
    absl::Status loaded;
    if (state.empty()) {
      absl::StatusOr<StateView> view = state_->Load();
      loaded = view.status();
      if (view.ok()) {
        absl::StatusOr<BlockedState> copy = CopyStateLocked(*view);
        state_->Release(*view);
        if (copy.ok()) state = *std::move(copy);
        loaded = copy.status();
      }
    }
    checkpoint_buffer_.Reset();
    absl::MutexLock lock(&mu_);
    checkpoint_step_ = -1;
    RETURN_IF_ERROR(loaded);
  }
  return SaveChunkState(path, state);
}

void Chunk::CancelCheckpoint() {
  absl::MutexLock state_lock(&state_mu_);
  checkpoint_state_.Reset();
  checkpoint_buffer_.Reset();
  absl::MutexLock lock(&mu_);
  checkpoint_step_ = -1;
}

}  // namespace strata
