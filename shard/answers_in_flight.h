// AnswersInFlight: the pull answers that gRPC still holds and that
// reference memory of the server's tiers rather than a copy of it
// (rpc/step_wire.h PullResponseBuffer). Each answer's owner keeps what owns
// that memory (its chunk) alive and counts as in flight until gRPC lets
// go of the answer; the server waits for none to be left before it frees
// its tiers.
//
// Thread-safe. Owners may be released on any thread, after the
// AnswersInFlight that made them is otherwise gone (they share it).
#ifndef STRATA_SHARD_ANSWERS_IN_FLIGHT_H_
#define STRATA_SHARD_ANSWERS_IN_FLIGHT_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata {

class AnswersInFlight : public std::enable_shared_from_this<AnswersInFlight> {
 public:
  // The owner of an answer that references memory `memory_owner` keeps
  // alive: in flight until released. Call on an AnswersInFlight held by a
  // shared_ptr.
  std::shared_ptr<const void> Hold(std::shared_ptr<const void> memory_owner)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Answers held now.
  int64_t held() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no answer is held or `deadline` passes; whether none is.
  bool AwaitNone(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Owner;

  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_SHARD_ANSWERS_IN_FLIGHT_H_
