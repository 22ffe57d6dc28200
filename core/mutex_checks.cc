#include "core/mutex_checks.h"

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace strata {

bool ConfigureMutexDeadlockChecks() {
  const char* wanted = std::getenv(kMutexDeadlockChecksEnv);
  if (wanted != nullptr && std::strcmp(wanted, "1") == 0) return true;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return false;
}

}  // namespace strata
