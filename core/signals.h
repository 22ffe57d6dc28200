// Waiting for SIGINT/SIGTERM in a daemon's main(). BlockShutdownSignals()
// must run before any thread starts, so that every thread inherits the mask;
// WaitForShutdownSignal() then returns the signal that arrived, and
// ServeUntilSignal() is the rest of a daemon's main().
#ifndef STRATA_CORE_SIGNALS_H_
#define STRATA_CORE_SIGNALS_H_

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/log.h"

namespace strata {

void BlockShutdownSignals();
int WaitForShutdownSignal();
// Writes `address` to `path` (atomically, by rename) so scripts know where a
// daemon listens; nothing when `path` is empty.
absl::Status WriteReadyFile(const std::string& path, const std::string& address);

// Once a daemon's Start() returned `daemon` (with address() and
// Shutdown()): prints a start error, or writes `ready_file`, waits for
// SIGINT or SIGTERM and shuts the daemon down. Returns main()'s exit status.
template <typename Daemon>
int ServeUntilSignal(const char* program, const char* log_component,
                     const absl::StatusOr<std::unique_ptr<Daemon>>& daemon,
                     const std::string& ready_file) {
  absl::Status s = daemon.ok() ? WriteReadyFile(ready_file, (*daemon)->address()) : daemon.status();
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, s.ToString().c_str());
    return 1;
  }
  int signal = WaitForShutdownSignal();
  LogEventCat(log_component, "received ", strsignal(signal), "; shutting down");
  (*daemon)->Shutdown();
  return 0;
}

}  // namespace strata

#endif  // STRATA_CORE_SIGNALS_H_
