// ThreadPool: Join() runs every queued task, also those the tasks schedule
// while it drains, before it returns; it may be called again.
#include "core/thread_pool.h"

#include <atomic>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ThreadPoolTest, JoinRunsTheTasksThatTasksScheduleBeforeItReturns) {
  constexpr int kDepth = 50;
  ThreadPool pool(2);
  absl::Notification release;
  std::atomic<int> ran{0};
  std::function<void(int)> chain = [&](int left) {
    ++ran;
    if (left > 0) pool.Schedule([&chain, left] { chain(left - 1); });
  };
  // The chain starts once Join() (most likely) started: its tasks are
  // scheduled while the pool stops.
  pool.Schedule([&] {
    release.WaitForNotification();
    chain(kDepth);
  });
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  pool.Join();
  EXPECT_EQ(ran.load(), kDepth + 1);
  pool.Join();  // idempotent
  releaser.join();
}

}  // namespace
}  // namespace strata
