// ProcStatusBytes: a memory field of /proc/PID/status (VmRSS, VmHWM, VmLck)
// in bytes, for tests of what a process holds, resident or page-locked.
#ifndef STRATA_TESTING_PROC_STATUS_H_
#define STRATA_TESTING_PROC_STATUS_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::testing {

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

}  // namespace strata::testing

#endif  // STRATA_TESTING_PROC_STATUS_H_
