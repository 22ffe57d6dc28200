// Chunk's checkpoints (chunk.h): arming a step, waiting for it, and the
// save that writes the state its ChunkCheckpoint kept (chunk_checkpoint.h).
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
  if ((checkpoint_step_ >= 0 && checkpoint_step_ != step) || checkpoint_.writing()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is saving step ",
                     checkpoint_step_ >= 0 ? checkpoint_step_ : applied_step_, " to a checkpoint"));
  }
  checkpoint_step_ = step;
  checkpoint_failure_ = absl::OkStatus();
  checkpoint_.Arm(arena, std::move(path));
  return absl::OkStatus();
}

bool Chunk::CheckpointNeedsState(int64_t step) {
  if (checkpoint_.kept()) return false;
  absl::MutexLock lock(&mu_);
  return checkpoint_step_ == step;
}

void Chunk::KeepCheckpointState(int64_t step, const StateView& live) {
  {
    absl::MutexLock lock(&mu_);
    checkpoint_loss_scale_ = loss_scales_[step & 1];
  }
  if (absl::Status kept = checkpoint_.Keep(live); !kept.ok()) DisarmLocked(kept);
}

StateView Chunk::UpdateTarget(const StateView& loaded) {
  absl::Status written;
  const StateView target = checkpoint_.UpdateTarget(loaded, state_mu_, &written);
  if (!written.ok()) DisarmLocked(written);
  return target;
}

void Chunk::DisarmLocked(const absl::Status& failure) {
  checkpoint_.Disarm();
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
  // now; or the file an Apply() wrote, or that BeginSave() writes now when
  // the arena has no memory for a copy (Apply()s wait for that write).
  // Apply()s go on while a buffer or a copy is written.
  const std::byte* state = nullptr;
  ArenaState copy;
  RootedPath path;
  {
    absl::MutexLock state_lock(&state_mu_);
    const bool kept = checkpoint_.kept();
    {
      absl::MutexLock lock(&mu_);
      *loss_scale = kept ? checkpoint_loss_scale_ : loss_scales_[applied_step_ & 1];
      checkpoint_step_ = -1;
    }
    if (std::optional<uint64_t> written = checkpoint_.TakeWritten()) return *written;
    path = checkpoint_.path();
    absl::StatusOr<StateView> loaded = state_->Load();
    if (!loaded.ok()) {
      DisarmLocked(absl::OkStatus());
      return loaded.status();
    }
    absl::StatusOr<const std::byte*> source = checkpoint_.BeginSave(*loaded, &copy);
    state_->Release(*loaded);
    RETURN_IF_ERROR(source.status());
    if (*source == nullptr) return *checkpoint_.TakeWritten();
    state = *source;
  }
  absl::StatusOr<uint64_t> checksum =
      SaveOrChecksumChunkState(path, state, state_->shape().bytes());
  absl::MutexLock state_lock(&state_mu_);
  checkpoint_.EndSave();
  return checksum;
}

void Chunk::CancelCheckpoint() {
  absl::MutexLock state_lock(&state_mu_);
  DisarmLocked(absl::OkStatus());
}

}  // namespace strata
