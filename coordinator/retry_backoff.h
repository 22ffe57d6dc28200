// RetryBackoff: when work that failed for a key (a job id) is tried again.
// After a failure the key is due again after a delay: `first_delay` after
// its first failure, twice the last delay after each later one, at most
// `max_delay`. Forget() (the work succeeded, or its key is gone) starts the
// key over. Failed() says whether the failure differs from the key's last,
// so that a caller logs a failure that lasts once, not at every retry.
//
// Thread-compatible: callers serialize all calls.
#ifndef STRATA_COORDINATOR_RETRY_BACKOFF_H_
#define STRATA_COORDINATOR_RETRY_BACKOFF_H_

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace strata {

class RetryBackoff {
 public:
  RetryBackoff(absl::Duration first_delay, absl::Duration max_delay);

  // Whether `key` may be tried at `now`: it has no failure on record, or
  // its delay has passed.
  bool Due(const std::string& key, absl::Time now) const;
  // Records that trying `key` at `now` failed with `failure`: the key is due
  // again after its next delay. Returns whether `failure` differs from the
  // key's last failure (true for its first).
  bool Failed(const std::string& key, const std::string& failure, absl::Time now);
  // The delay after `key`'s last failure (zero: none on record).
  absl::Duration Delay(const std::string& key) const;
  // Drops `key`'s failures: it is due, and its next failure is a first.
  void Forget(const std::string& key);
  // Forget()s every key but `keys`.
  void ForgetAllBut(const std::vector<std::string>& keys);
  // Whether any key has a failure on record.
  bool empty() const { return failing_.empty(); }

 private:
  struct Failing {
    std::string failure;
    absl::Duration delay;
    absl::Time due;
  };

  const absl::Duration first_delay_;
  const absl::Duration max_delay_;
  std::map<std::string, Failing> failing_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_RETRY_BACKOFF_H_
