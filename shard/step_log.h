// StepLog: the steps one chunk applied since a point, kept for a new copy of
// the chunk that catches up on another server while its job trains
// (shard/catch_up_copy.h): each step's scalars and gradients over the whole
// chunk, in the job's dtype, until the reader has them.
//
// Bounded: a log holds at most kMaxSteps steps (each the chunk's gradients:
// at most 2/3 of the chunk's FP32 state in all, 1/3 for 16-bit gradients).
// A step beyond them, or one that comes after the reader was silent
// for kMaxIdle, ends the log: its steps are freed and every later read is
// the error that ended it, rather than the server holding gradients for a
// copy that fell behind or whose reader is gone.
//
// Thread-safe.
#ifndef STRATA_SHARD_STEP_LOG_H_
#define STRATA_SHARD_STEP_LOG_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata {

// One applied step of a chunk, as a copy replays it.
struct LoggedStep {
  int64_t step = 0;
  float coef = 1.0f;
  float lr = 0.0f;               // the step's learning rate (the job's when unset)
  std::vector<float> group_lrs;  // per parameter group; empty: lr for all
  std::string grads;             // the chunk's whole range, in the job's dtype
};

class StepLog {
 public:
  static constexpr size_t kMaxSteps = 8;
  static constexpr absl::Duration kMaxIdle = absl::Seconds(60);

  // A log of the steps after `since_step` (the chunk's applied step when it
  // began) of the chunk `name` (for errors).
  StepLog(int64_t since_step, std::string name);

  int64_t since_step() const { return since_step_; }
  // Adds the step after the last one (the chunk applied it); nothing once
  // the log ended. Ends the log when it would pass a bound.
  void Append(std::shared_ptr<const LoggedStep> step) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the steps up to `release_through` (the reader has them) and
  // returns the steps after `after_step`, in order; the error that ended
  // the log otherwise.
  absl::StatusOr<std::vector<std::shared_ptr<const LoggedStep>>> Read(int64_t release_through,
                                                                      int64_t after_step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK, or the error that ended the log.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the log with `why` (not OK); later reads return it.
  void End(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void EndLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t since_step_;
  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<const LoggedStep>> steps_ ABSL_GUARDED_BY(mu_);
  absl::Time last_read_ ABSL_GUARDED_BY(mu_);
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_SHARD_STEP_LOG_H_
