// Starting another program: fork and exec, for tests and strata-bench that
// run daemons and workers as real processes. Stateless.
#ifndef STRATA_CORE_SUBPROCESS_H_
#define STRATA_CORE_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// Starts `args[0]` (a path) with `args`; its stderr is appended to
// `stderr_path` unless that is empty. Returns the child's pid, always > 0
// (the child exits with 127 when the exec fails, 126 when the log cannot be
// opened); INTERNAL naming the program when fork() fails.
absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& args,
                                   const std::string& stderr_path = "");

}  // namespace strata

#endif  // STRATA_CORE_SUBPROCESS_H_
