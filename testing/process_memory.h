// What a process holds in memory, for tests: fields of /proc/PID/status
// (resident, peak, page-locked), the resident pages of a range, what it may
// page-lock, and a scope without transparent huge pages.
#ifndef STRATA_TESTING_PROCESS_MEMORY_H_
#define STRATA_TESTING_PROCESS_MEMORY_H_

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// Whether ASan instruments this build: GCC defines __SANITIZE_ADDRESS__,
// clang answers __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define STRATA_TESTING_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRATA_TESTING_UNDER_ASAN 1
#endif
#endif

namespace strata::testing {

// Under ASan a process's memory holds its shadow memory and quarantine, and
// mlock is a no-op (its interceptor locks nothing): tests of what a process
// holds or locks skip there.
#if defined(STRATA_TESTING_UNDER_ASAN)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif

// The field in bytes, or 0 when the file or the field is missing.
inline uint64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    uint64_t kib = 0;
    std::string number = line.substr(field.size() + 1);
    number = number.substr(0, number.find("kB"));
    if (absl::SimpleAtoi(number, &kib)) return kib * 1024;
  }
  return 0;
}

// This process's page-locked bytes.
inline uint64_t LockedBytes() { return ProcStatusBytes(getpid(), "VmLck"); }

// The bytes this process may page-lock: its memlock limit (0 when it cannot
// be read), or the largest uint64_t where none applies (root, no limit).
inline uint64_t MemlockLimitBytes() {
  if (geteuid() == 0) return std::numeric_limits<uint64_t>::max();
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 0;
  if (limit.rlim_cur == RLIM_INFINITY) return std::numeric_limits<uint64_t>::max();
  return limit.rlim_cur;
}

// Pages of [data, data + num_bytes) resident in memory (mincore), `data`
// page-aligned; 0 when mincore refuses.
inline size_t ResidentPages(const void* data, size_t num_bytes) {
  const size_t page_bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((num_bytes + page_bytes - 1) / page_bytes);
  if (mincore(const_cast<void*>(data), num_bytes, resident.data()) != 0) return 0;
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

// Within its scope this process takes no transparent huge pages: faults map
// base pages and khugepaged collapses none of its ranges. A test that counts
// the resident pages of a huge-page-advised range needs it: khugepaged may,
// at any moment, collapse an aligned 2 MiB range holding one written page
// (max_ptes_none, 511 by default) into a huge page, and two adjacent
// mappings with the same flags merge into one that can hold such a range.
// Not thread-safe: the setting is the process's.
class NoTransparentHugePages {
 public:
  NoTransparentHugePages() { prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0); }
  ~NoTransparentHugePages() { prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0); }
  NoTransparentHugePages(const NoTransparentHugePages&) = delete;
  NoTransparentHugePages& operator=(const NoTransparentHugePages&) = delete;
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_PROCESS_MEMORY_H_
