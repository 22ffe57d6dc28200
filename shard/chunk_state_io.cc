// Chunk's reads and writes of its whole state outside the step (chunk.h):
// the initial parameters, a state set before the first push (a seed, a
// checkpoint, an import) in FP32 or its stored form, and reads of it.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"
#include "shard/chunk.h"
#include "shard/state_math.h"

namespace strata {

absl::Status Chunk::WriteParams(uint64_t begin, const float* params, uint64_t n) {
  {
    absl::MutexLock lock(&mu_);
    if (applied_step_ != 0 || applying_ || !staged_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                       "; parameters can be written only before the first step"));
    }
    RETURN_IF_ERROR(NotLentLocked());
  }
  return WriteAndCommit(begin, n, /*step=*/0, [&](const StateView& view, uint64_t offset) {
    std::memcpy(view.p + offset, params, n * sizeof(float));
    return absl::OkStatus();
  });
}

absl::Status Chunk::WriteAndCommit(uint64_t begin, uint64_t n, int64_t step, StateWrite write) {
  absl::MutexLock state_lock(&state_mu_);
  if (checkpoint_.holds_buffer()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                     " is being saved to a checkpoint; write its state after the save"));
  }
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  const StateView live = checkpoint_.LiveView(view);
  const uint64_t offset = begin - range_.begin;
  if (absl::Status written = write(live, offset); !written.ok()) {
    state_->Release(view);
    return written;
  }
  CastFromFloat(live.p + offset, dtype_, copy(step) + offset * DTypeSize(dtype_), n);
  return CommitAndRelease(view, step);
}

absl::Status Chunk::WriteState(uint64_t begin, const float* p, const float* m, const float* v,
                               uint64_t n, int64_t step, absl::string_view previous) {
  return SetState(begin, n, step, previous, [&](const StateView& view, uint64_t offset) {
    WriteStateFp32(state_->shape(), view, offset, n, p, m, v);
    return absl::OkStatus();
  });
}

absl::Status Chunk::WriteStoredState(uint64_t begin, uint64_t n, int64_t step,
                                     absl::string_view previous, const std::byte* stored) {
  RETURN_IF_ERROR(CheckStoredRange(begin, n));
  return SetState(begin, n, step, previous, [&](const StateView& view, uint64_t offset) {
    WriteStoredRange(state_->shape(), view, offset, n, stored);
    return absl::OkStatus();
  });
}

absl::Status Chunk::WriteStoredState(int64_t step,
                                     absl::FunctionRef<absl::Status(std::byte*)> fill) {
  return SetState(range_.begin, range_.size(), step, /*previous=*/{},
                  [&](const StateView& view, uint64_t) { return fill(view.bytes()); });
}

absl::Status Chunk::SettleState() {
  {
    absl::MutexLock state_lock(&state_mu_);
    RETURN_IF_ERROR(state_->Settle());
  }
  return host_->Settle(copy_extent_);
}

absl::Status Chunk::SetState(uint64_t begin, uint64_t n, int64_t step, absl::string_view previous,
                             StateWrite write) {
  const size_t esize = DTypeSize(dtype_);
  if (!previous.empty() && (previous.size() != n * esize || step < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("previous_params: ", previous.size(), " bytes at step ", step,
                     "; the copy of the step before a step >= 1 has ", n * esize));
  }
  {
    absl::MutexLock lock(&mu_);
    if (applied_any_ || applying_ || !staged_.empty() ||
        (applied_step_ != 0 && applied_step_ != step)) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is at step ", applied_step_,
                       applied_any_ || !staged_.empty() ? " and has been pushed to" : "",
                       "; its state can be written only before the first push, at one step"));
    }
    RETURN_IF_ERROR(NotLentLocked());
    applied_step_ = step;
    applied_round_.reset();
    awaiting_seed_ = false;
    if (!previous.empty()) {
      std::memcpy(copy(step - 1) + (begin - range_.begin) * esize, previous.data(),
                  previous.size());
      previous_written_ += n;
    }
    previous_copy_valid_ = previous_written_ == range_.size();
  }
  return WriteAndCommit(begin, n, step, write);
}

absl::Status Chunk::NotLentLocked() const {
  if (!lent_for_seed_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("chunk ", chunk_id_, " of job ", job_id_,
                                                    " is being seeded in place; its state can "
                                                    "be written once the seed ends"));
}

std::optional<Chunk::SeedBuffers> Chunk::LendForSeed() {
  absl::MutexLock state_lock(&state_mu_);
  if (state_->tier() != TierKind::kHost || checkpoint_.holds_buffer()) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    // Awaiting its seed, the chunk holds no state (a WriteState ends the wait).
    if (!awaiting_seed_ || lent_for_seed_ || applying_ || !staged_.empty()) return std::nullopt;
    lent_for_seed_ = true;
  }
  absl::StatusOr<StateView> view = state_->Load();
  if (!view.ok()) {
    EndSeedLoan();
    return std::nullopt;
  }
  std::byte* state = view->bytes();
  state_->Release(*view);
  return SeedBuffers{state, copies_};
}

absl::Status Chunk::CommitLentSeed(int64_t step, bool previous) {
  absl::MutexLock state_lock(&state_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!lent_for_seed_) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " is not lent to a seed"));
    }
    lent_for_seed_ = false;
    applied_step_ = step;
    applied_round_.reset();
    awaiting_seed_ = false;
    previous_written_ = previous && step > 0 ? range_.size() : 0;
    previous_copy_valid_ = previous_written_ == range_.size();
  }
  ASSIGN_OR_RETURN(StateView view, state_->Load());
  return CommitAndRelease(view, step);
}

void Chunk::EndSeedLoan() {
  absl::MutexLock lock(&mu_);
  lent_for_seed_ = false;
}

absl::StatusOr<int64_t> Chunk::ReadState(uint64_t begin, uint64_t n, float* p_out, float* m_out,
                                         float* v_out) {
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView loaded, state_->Load());
  const StateView view = checkpoint_.LiveView(loaded);
  ReadStateFp32(state_->shape(), view, begin - range_.begin, n, p_out, m_out, v_out);
  state_->Release(loaded);
  return applied_step();
}

absl::Status Chunk::CheckStoredRange(uint64_t begin, uint64_t n) const {
  if (!IsStoredRange(state_->shape(), begin - range_.begin, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("[", begin, ", +", n, ") of chunk ", chunk_id_, " of job ", job_id_,
                     " cuts a block of its 8-bit states (blocks of ", kInt8StateBlock,
                     " from the chunk's first parameter) and has no stored form of its own"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Chunk::CopyState(uint64_t begin, uint64_t n, std::byte* out) {
  RETURN_IF_ERROR(CheckStoredRange(begin, n));
  absl::MutexLock state_lock(&state_mu_);
  ASSIGN_OR_RETURN(StateView loaded, state_->Load());
  ReadStoredRange(state_->shape(), checkpoint_.LiveView(loaded), begin - range_.begin, n, out);
  state_->Release(loaded);
  return applied_step();
}

}  // namespace strata
