// A fixed pool of threads running queued tasks in FIFO order.
// Schedule() is thread-safe. Join() (and the destructor) runs every task
// queued, also those its tasks schedule, then joins the threads; no task may
// be scheduled from outside the pool after it starts.
#ifndef STRATA_CORE_THREAD_POOL_H_
#define STRATA_CORE_THREAD_POOL_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace strata {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(absl::AnyInvocable<void() &&> task);
  // Runs the queue dry and joins the threads. Idempotent; called by one
  // thread, not a task of the pool.
  void Join();
  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkLoop();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata

#endif  // STRATA_CORE_THREAD_POOL_H_
