// ConfigureMutexDeadlockChecks: absl::Mutex's deadlock detection is off
// unless STRATA_MUTEX_DEADLOCK_CHECKS=1 keeps it, as an inversion of lock
// order shows: abseil aborts on one while its detection is on (Debian's
// abseil, built without NDEBUG, has it on).
#include "core/mutex_checks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Locks a then b, then b then a: a cycle in the history of lock order.
void InvertLockOrder() {
  absl::Mutex a, b;
  {
    absl::MutexLock first(&a);
    absl::MutexLock second(&b);
  }
  absl::MutexLock first(&b);
  absl::MutexLock second(&a);
}

// Whether this process's abseil aborts on an inversion as it was set up (a
// child tries).
bool AbortsOnInversion() {
  const pid_t child = fork();
  if (child == 0) {
    InvertLockOrder();
    _exit(0);
  }
  int status = 0;
  return child > 0 && waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
         WTERMSIG(status) == SIGABRT;
}

TEST(MutexChecksDeathTest, AnInversionGoesByOnceTurnedOff) {
  EXPECT_EXIT(
      {
        unsetenv(kMutexDeadlockChecksEnv);
        if (ConfigureMutexDeadlockChecks()) _exit(1);
        InvertLockOrder();
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(MutexChecksDeathTest, TheEnvironmentKeepsThemOn) {
  if (!AbortsOnInversion()) GTEST_SKIP() << "this abseil does not check lock order";
  EXPECT_DEATH(
      {
        setenv(kMutexDeadlockChecksEnv, "1", 1);
        if (!ConfigureMutexDeadlockChecks()) _exit(1);
        InvertLockOrder();
      },
      "Potential Mutex deadlock");
}

}  // namespace
}  // namespace strata
