#include "shard/step_log.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {

StepLog::StepLog(int64_t since_step, std::string name)
    : since_step_(since_step), name_(std::move(name)), last_read_(absl::Now()) {}

void StepLog::Append(std::shared_ptr<const LoggedStep> step) {
  absl::MutexLock lock(&mu_);
  if (!ended_.ok()) return;
  if (absl::Now() - last_read_ > kMaxIdle) {
    EndLocked(absl::DeadlineExceededError(
        absl::StrCat("the step log of ", name_, " was not read for ",
                     absl::FormatDuration(kMaxIdle), ": its reader is gone")));
    return;
  }
  if (steps_.size() == kMaxSteps) {
    EndLocked(absl::ResourceExhaustedError(absl::StrCat(
        "the step log of ", name_, " holds ", kMaxSteps, " steps: its copy fell behind by more")));
    return;
  }
  steps_.push_back(std::move(step));
}

absl::StatusOr<std::vector<std::shared_ptr<const LoggedStep>>> StepLog::Read(
    int64_t release_through, int64_t after_step) {
  absl::MutexLock lock(&mu_);
  if (!ended_.ok()) return ended_;
  last_read_ = absl::Now();
  while (!steps_.empty() && steps_.front()->step <= release_through) steps_.pop_front();
  std::vector<std::shared_ptr<const LoggedStep>> out;
  for (const auto& step : steps_) {
    if (step->step > after_step) out.push_back(step);
  }
  return out;
}

absl::Status StepLog::status() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

void StepLog::End(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  EndLocked(why);
}

void StepLog::EndLocked(const absl::Status& why) {
  if (!ended_.ok()) return;
  ended_ = why;
  steps_.clear();
}

}  // namespace strata
