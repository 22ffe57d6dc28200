// Chunk's step log (chunk.h): each step a chunk applies, kept for a new
// copy of it that catches up on another server (shard/step_log.h).
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shard/chunk.h"

namespace strata {

std::shared_ptr<StepLog> Chunk::StartStepLog() {
  // Under state_mu_, no Apply() is between reading the log and appending
  // its step: the new log begins after the step applied last.
  absl::MutexLock state_lock(&state_mu_);
  absl::MutexLock lock(&mu_);
  if (log_ != nullptr) log_->End(absl::CancelledError("a new step log began"));
  log_ = std::make_shared<StepLog>(applied_step_,
                                   absl::StrCat("chunk ", chunk_id_, " of job ", job_id_));
  return log_;
}

absl::StatusOr<std::shared_ptr<StepLog>> Chunk::step_log() const {
  absl::MutexLock lock(&mu_);
  if (log_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_id_, " of job ", job_id_, " keeps no step log: start one"));
  }
  return log_;
}

void Chunk::EndStepLog() {
  absl::MutexLock lock(&mu_);
  if (log_ == nullptr) return;
  log_->End(absl::CancelledError("the step log was ended"));
  log_.reset();
}

std::shared_ptr<const LoggedStep> Chunk::LogEntry(
    int64_t step, const StepScalars& scalars, const std::map<uint64_t, StagedPush>& pushes) const {
  auto logged = std::make_shared<LoggedStep>();
  logged->step = step;
  logged->coef = scalars.coef;
  logged->lr = scalars.lr.value_or(adam_.lr);
  logged->group_lrs = scalars.group_lrs;
  const size_t esize = DTypeSize(dtype_);
  logged->grads.resize(range_.size() * esize);
  for (const GradRange& g : GradRanges(pushes)) {
    std::memcpy(logged->grads.data() + g.offset * esize, g.grads, g.n * esize);
  }
  return logged;
}

}  // namespace strata
