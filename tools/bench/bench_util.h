// Helpers shared by the strata-bench commands: aligned buffers, running a
// function over the chunks of N elements on a thread pool (as the shard
// server's step executor does), medians, a process's peak resident memory,
// and where the daemons' binaries are. Not thread-safe.
#ifndef STRATA_TOOLS_BENCH_BENCH_UTIL_H_
#define STRATA_TOOLS_BENCH_BENCH_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "core/round_up.h"
#include "core/thread_pool.h"
#include "testing/process_memory.h"

namespace strata {

// Elements per chunk, as in a job's default chunk size.
inline constexpr size_t kBenchChunkElements = size_t{4} << 20;

// Peak resident memory (VmHWM) of process `pid` in bytes; 0 when
// unreadable.
inline uint64_t PeakRssBytes(pid_t pid = getpid()) {
  return testing::ProcStatusBytes(pid, "VmHWM");
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// An uninitialized buffer of `num_bytes`, aligned to 2 MiB and backed by
// transparent huge pages where the kernel allows (fewer TLB misses on the
// kernels' several streams).
inline std::unique_ptr<uint8_t[], FreeDeleter> AlignedBytes(size_t num_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  size_t rounded = RoundUp(num_bytes, kHugePage);
  void* p = std::aligned_alloc(kHugePage, rounded);
  madvise(p, rounded, MADV_HUGEPAGE);
  return std::unique_ptr<uint8_t[], FreeDeleter>(static_cast<uint8_t*>(p));
}

// Runs fn(begin, end) over [0, n) in chunks of kBenchChunkElements on `pool`;
// returns the wall time in seconds.
inline double TimeChunks(ThreadPool& pool, size_t n,
                         const std::function<void(size_t, size_t)>& fn) {
  size_t chunks = (n + kBenchChunkElements - 1) / kBenchChunkElements;
  absl::BlockingCounter done(static_cast<int>(chunks));
  absl::Time started = absl::Now();
  for (size_t c = 0; c < chunks; ++c) {
    pool.Schedule([&, c] {
      size_t begin = c * kBenchChunkElements;
      fn(begin, std::min(n, begin + kBenchChunkElements));
      done.DecrementCount();
    });
  }
  done.Wait();
  return absl::ToDoubleSeconds(absl::Now() - started);
}

// The directory of this binary, where the daemons' binaries are too.
inline std::string BinDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_BENCH_UTIL_H_
