// Reachability: when the coordinator last heard from any worker or shard
// server (a heartbeat, a join, a generation stream opened, a healthy answer)
// -- its evidence that its own network works. A coordinator cut off from
// everyone hears every peer fall silent at once; it must not take that for
// every peer failing (Membership expires no lease then: the workers train on
// without it, and renew their leases once it is back).
//
// Thread-safe.
#ifndef STRATA_COORDINATOR_REACHABILITY_H_
#define STRATA_COORDINATOR_REACHABILITY_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {

class Reachability {
 public:
  // A peer answered or called just now.
  void Heard() {
    absl::MutexLock lock(&mu_);
    last_heard_ = absl::Now();
  }
  // Whether some peer was heard from after `time`.
  bool HeardAfter(absl::Time time) const {
    absl::MutexLock lock(&mu_);
    return last_heard_ > time;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_REACHABILITY_H_
