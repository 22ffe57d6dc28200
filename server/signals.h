// Waiting for SIGINT/SIGTERM in a daemon's main(). BlockShutdownSignals()
// must run before any thread starts, so that every thread inherits the mask;
// WaitForShutdownSignal() then returns the signal that arrived.
#ifndef STRATA_SERVER_SIGNALS_H_
#define STRATA_SERVER_SIGNALS_H_

#include <string>

#include "absl/status/status.h"

namespace strata {

void BlockShutdownSignals();
int WaitForShutdownSignal();
// Writes `address` to `path` (atomically, by rename) so scripts know where a
// daemon listens; nothing when `path` is empty.
absl::Status WriteReadyFile(const std::string& path, const std::string& address);

}  // namespace strata

#endif  // STRATA_SERVER_SIGNALS_H_
