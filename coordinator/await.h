// Await: blocks until an asynchronous call (FanOut, ShardFleet) reports.
// Thread-safe; never call it on a gRPC callback thread.
#ifndef STRATA_COORDINATOR_AWAIT_H_
#define STRATA_COORDINATOR_AWAIT_H_

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"

namespace strata {

// Runs `start(done)` and waits for it to call `done(status)`; the status.
inline absl::Status Await(const std::function<void(std::function<void(absl::Status)>)>& start) {
  absl::Notification finished;
  absl::Status out;
  start([&](absl::Status s) {
    out = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  return out;
}

}  // namespace strata

#endif  // STRATA_COORDINATOR_AWAIT_H_
