// CPU time, for the benches that set a step against the CPU it needs:
// this process's (getrusage: microseconds, all its threads). Thread-safe.
#ifndef STRATA_TOOLS_BENCH_PROCESS_CPU_H_
#define STRATA_TOOLS_BENCH_PROCESS_CPU_H_

#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

namespace strata {

// User and system CPU seconds of this process so far.
inline double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_PROCESS_CPU_H_
