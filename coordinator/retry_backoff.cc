#include "coordinator/retry_backoff.h"

#include <algorithm>
#include <iterator>

namespace strata {

RetryBackoff::RetryBackoff(absl::Duration first_delay, absl::Duration max_delay)
    : first_delay_(first_delay), max_delay_(std::max(first_delay, max_delay)) {}

bool RetryBackoff::Due(const std::string& key, absl::Time now) const {
  auto it = failing_.find(key);
  return it == failing_.end() || now >= it->second.due;
}

bool RetryBackoff::Failed(const std::string& key, const std::string& failure, absl::Time now) {
  auto [it, first] = failing_.try_emplace(key);
  Failing& f = it->second;
  f.delay = first ? first_delay_ : std::min(2 * f.delay, max_delay_);
  f.due = now + f.delay;
  const bool changed = first || f.failure != failure;
  f.failure = failure;
  return changed;
}

absl::Duration RetryBackoff::Delay(const std::string& key) const {
  auto it = failing_.find(key);
  return it == failing_.end() ? absl::ZeroDuration() : it->second.delay;
}

void RetryBackoff::Forget(const std::string& key) { failing_.erase(key); }

void RetryBackoff::ForgetAllBut(const std::vector<std::string>& keys) {
  for (auto it = failing_.begin(); it != failing_.end();) {
    const bool kept = std::find(keys.begin(), keys.end(), it->first) != keys.end();
    it = kept ? std::next(it) : failing_.erase(it);
  }
}

}  // namespace strata
