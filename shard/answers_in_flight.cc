#include "shard/answers_in_flight.h"

#include <utility>

namespace strata {

class AnswersInFlight::Owner {
 public:
  Owner(std::shared_ptr<AnswersInFlight> answers, std::shared_ptr<const void> memory_owner)
      : answers_(std::move(answers)), memory_owner_(std::move(memory_owner)) {}
  ~Owner() {
    // The memory's owner goes first: the count says what still holds memory.
    memory_owner_.reset();
    absl::MutexLock lock(&answers_->mu_);
    --answers_->held_;
  }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

 private:
  const std::shared_ptr<AnswersInFlight> answers_;
  std::shared_ptr<const void> memory_owner_;
};

std::shared_ptr<const void> AnswersInFlight::Hold(std::shared_ptr<const void> memory_owner) {
  {
    absl::MutexLock lock(&mu_);
    ++held_;
  }
  return std::make_shared<const Owner>(shared_from_this(), std::move(memory_owner));
}

int64_t AnswersInFlight::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

bool AnswersInFlight::AwaitNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
}

}  // namespace strata
