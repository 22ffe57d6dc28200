// Chunk's checkpoints (chunk.h): the state of an armed step kept aside while
// training goes on -- a host-tier chunk's live buffer held and its updates
// written out of place, an NVMe- or GPU-tier chunk's state copied into the
// arena -- and written to its file by SaveCheckpoint().
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "shard/chunk.h"
#include "shard/saved_chunk.h"

namespace strata {

absl::Status Chunk::ArmCheckpoint(int64_t step, StateArena* arena, RootedPath path) {
  // Under state_mu_, no Apply() is between its check of the armed step and
  // its update: it applied before (and the chunk is past `step`) or will see it.
  absl::MutexLock state_lock(&state_mu_);
  absl::MutexLock lock(&mu_);
  if (applied_step_ > step) {
    return absl::AbortedError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ",
                                           applied_step_, ", past the checkpoint's step ", step));
  }
  if ((checkpoint_step_ >= 0 && checkpoint_step_ != step) || writing_held_) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is saving step ",
                     checkpoint_step_ >= 0 ? checkpoint_step_ : applied_step_, " to a checkpoint"));
  }
  checkpoint_step_ = step;
  checkpoint_failure_ = absl::OkStatus();
  checkpoint_arena_ = arena;
  checkpoint_path_ = std::move(path);
  checkpoint_written_.reset();
  return absl::OkStatus();
}

StateView Chunk::LiveView(const StateView& loaded) const {
  return live_in_shadow_ ? shadow_.view() : loaded;
}

bool Chunk::CheckpointNeedsState(int64_t step) {
  if (held_ != Buffer::kNone || !checkpoint_copy_.empty() || checkpoint_written_.has_value()) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  return checkpoint_step_ == step;
}

void Chunk::KeepCheckpointState(int64_t step, const StateView& live) {
  {
    absl::MutexLock lock(&mu_);
    checkpoint_loss_scale_ = loss_scales_[step & 1];
  }
  if (state_->tier() == TierKind::kHost) {
    held_ = LiveBuffer();
    return;
  }
  absl::StatusOr<ArenaState> copy = CopyToArena(live);
  if (!copy.ok()) {
    WriteCheckpointNow(live);
    return;
  }
  checkpoint_copy_ = *std::move(copy);
}

void Chunk::WriteCheckpointNow(const StateView& live) {
  absl::StatusOr<uint64_t> checksum =
      SaveOrChecksumChunkState(checkpoint_path_, live.bytes(), state_->shape().bytes());
  held_ = Buffer::kNone;
  if (!checksum.ok()) {
    DisarmLocked(checksum.status());
    return;
  }
  checkpoint_written_ = *checksum;
}

absl::StatusOr<ArenaState> Chunk::CopyToArena(const StateView& view) {
  ASSIGN_OR_RETURN(ArenaState copy, ArenaState::Take(checkpoint_arena_, state_->shape()));
  copy.CopyFrom(view);
  return copy;
}

StateView Chunk::UpdateTarget(const StateView& loaded) {
  const Buffer live = LiveBuffer();
  if (held_ == live) {
    if (live == Buffer::kShadow) return loaded;
    if (shadow_.empty()) {
      absl::StatusOr<ArenaState> shadow = ArenaState::Take(checkpoint_arena_, state_->shape());
      if (!shadow.ok()) {
        state_mu_.Await(absl::Condition(
            +[](bool* writing) { return !*writing; }, &writing_held_));
        if (held_ == live) WriteCheckpointNow(loaded);
        return loaded;
      }
      shadow_ = *std::move(shadow);
    }
    return shadow_.view();
  }
  // The live state in the shadow and the extent free: back to the extent.
  if (live == Buffer::kShadow && held_ != Buffer::kExtent) return loaded;
  return LiveView(loaded);
}

void Chunk::ReleaseUnusedShadow() {
  if (!live_in_shadow_ && held_ != Buffer::kShadow) shadow_.Reset();
}

void Chunk::DisarmLocked(const absl::Status& failure) {
  if (!writing_held_) {
    held_ = Buffer::kNone;
    ReleaseUnusedShadow();
  }
  checkpoint_copy_.Reset();
  checkpoint_written_.reset();
  absl::MutexLock lock(&mu_);
  checkpoint_step_ = -1;
  checkpoint_failure_ = failure;
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

absl::StatusOr<uint64_t> Chunk::SaveCheckpoint(std::optional<LossScaleState>* loss_scale) {
  RETURN_IF_ERROR(AwaitCheckpointStep(absl::InfinitePast()));
  // The state of the armed step: the buffer held (by an Apply() that went
  // past it, or now: the chunk is at the step and no Apply() runs while
  // state_mu_ is held), or the copy an Apply() made (NVMe tier), or one made
  // now; or the file an Apply() wrote. Apply()s go on while it is written.
  const std::byte* state = nullptr;
  ArenaState copy;
  RootedPath path;
  {
    absl::MutexLock state_lock(&state_mu_);
    const bool kept =
        held_ != Buffer::kNone || !checkpoint_copy_.empty() || checkpoint_written_.has_value();
    {
      absl::MutexLock lock(&mu_);
      *loss_scale = kept ? checkpoint_loss_scale_ : loss_scales_[applied_step_ & 1];
      checkpoint_step_ = -1;
    }
    if (checkpoint_written_.has_value()) return *std::exchange(checkpoint_written_, std::nullopt);
    path = checkpoint_path_;
    absl::StatusOr<StateView> loaded = state_->Load();
    if (!loaded.ok()) {
      DisarmLocked(absl::OkStatus());
      return loaded.status();
    }
    if (state_->tier() == TierKind::kHost) {
      if (held_ == Buffer::kNone) held_ = LiveBuffer();
      state = held_ == Buffer::kShadow ? shadow_.data() : loaded->bytes();
      writing_held_ = true;
    } else if (!checkpoint_copy_.empty()) {
      copy = std::move(checkpoint_copy_);
    } else {
      absl::StatusOr<ArenaState> made = CopyToArena(*loaded);
      if (!made.ok()) {
        state_->Release(*loaded);
        return made.status();
      }
      copy = *std::move(made);
    }
    state_->Release(*loaded);
    if (state == nullptr) state = copy.data();
  }
  absl::StatusOr<uint64_t> checksum =
      SaveOrChecksumChunkState(path, state, state_->shape().bytes());
  absl::MutexLock state_lock(&state_mu_);
  writing_held_ = false;
  held_ = Buffer::kNone;
  ReleaseUnusedShadow();
  return checksum;
}

void Chunk::CancelCheckpoint() {
  absl::MutexLock state_lock(&state_mu_);
  DisarmLocked(absl::OkStatus());
}

}  // namespace strata
