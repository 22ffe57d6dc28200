#include "core/parallel_for.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace strata {

absl::Status ParallelFor(size_t n, size_t threads,
                         absl::FunctionRef<absl::Status(size_t thread, size_t i)> work,
                         absl::FunctionRef<void(size_t i)> skipped) {
  absl::Mutex mu;
  size_t next = 0;     // the next item to start
  absl::Status error;  // the first

  auto run = [&](size_t thread) {
    for (;;) {
      size_t i;
      bool skip;
      {
        absl::MutexLock lock(&mu);
        if (next == n) return;
        i = next++;
        skip = !error.ok();
      }
      if (skip) {
        skipped(i);
        continue;
      }
      absl::Status status = work(thread, i);
      if (status.ok()) continue;
      absl::MutexLock lock(&mu);
      if (error.ok()) error = std::move(status);
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min(threads, n); ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& helper : helpers) helper.join();
  return error;
}

}  // namespace strata
