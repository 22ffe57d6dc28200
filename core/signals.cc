#include "core/signals.h"

#include <signal.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSignals();
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

absl::Status WriteReadyFile(const std::string& path, const std::string& address) {
  if (path.empty()) return absl::OkStatus();
  std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp);
    out << address << "\n";
    if (!out) return absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace strata
