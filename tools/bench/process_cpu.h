// CPU time, for the benches that set a step against the CPU it needs:
// this process's (getrusage: microseconds, all its threads) and the whole
// machine's (/proc/stat: clock ticks, 10 ms where USER_HZ is 100, summed
// over the cores). Thread-safe.
#ifndef STRATA_TOOLS_BENCH_PROCESS_CPU_H_
#define STRATA_TOOLS_BENCH_PROCESS_CPU_H_

#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace strata {

// User and system CPU seconds of this process so far.
inline double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// CPU seconds every core of this machine spent busy so far (user, nice,
// system, interrupts and softirqs of /proc/stat: what a step costs beyond
// its processes' own time, such as loopback TCP's receive work in kernel
// threads; neither idle, I/O wait nor time stolen by the hypervisor); 0
// when unreadable.
inline double MachineBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string label;
  uint64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  if (!(in >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq) ||
      label != "cpu") {
    return 0;
  }
  return static_cast<double>(user + nice + system + irq + softirq) / sysconf(_SC_CLK_TCK);
}

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_PROCESS_CPU_H_
