#include "core/subprocess.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& args,
                                   const std::string& stderr_path) {
  // Everything the child uses is made before fork(): in a process with other
  // threads the child may make only async-signal-safe calls until it execs
  // (a lock another thread held at the fork -- malloc's, stdio's -- stays
  // held in the child for ever, and the child hangs before it starts).
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const char* log = stderr_path.empty() ? nullptr : stderr_path.c_str();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork() for ", args.empty() ? "" : args.front(),
                                            " failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    if (log != nullptr) {
      const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0666);
      if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(126);
      if (fd != STDERR_FILENO) close(fd);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace strata
