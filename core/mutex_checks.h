// absl::Mutex's deadlock detection in the processes that serve. Debian's
// abseil is built without NDEBUG, which leaves the detection of its debug
// builds on: every Mutex::Lock() looks the mutex up in one process-wide
// graph under one global spin lock (and adds an edge from each mutex the
// thread holds), and a cycle in that history aborts the process. On a
// 2-vCPU VM an uncontended Lock()/Unlock() took 69 ns with it and 10 ns
// without, and two threads that each locked a mutex of their own took
// 115 ns a lock: no two threads of the process lock at once, however many
// cores it has. The daemons and strata-bench turn it off (abseil's release
// default) unless kMutexDeadlockChecksEnv is "1", which the test suite sets
// for the daemons it starts; test binaries keep it, where an inversion of
// lock order should fail loudly.
//
// Thread-safe; called first thing in main().
#ifndef STRATA_CORE_MUTEX_CHECKS_H_
#define STRATA_CORE_MUTEX_CHECKS_H_

namespace strata {

inline constexpr char kMutexDeadlockChecksEnv[] = "STRATA_MUTEX_DEADLOCK_CHECKS";

// Turns absl::Mutex deadlock detection off, unless kMutexDeadlockChecksEnv
// is "1" (then it is left as abseil set it). Whether it is on afterwards.
bool ConfigureMutexDeadlockChecks();

}  // namespace strata

#endif  // STRATA_CORE_MUTEX_CHECKS_H_
