#include "core/subprocess.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& args,
                                   const std::string& stderr_path) {
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork() for ", args.empty() ? "" : args.front(),
                                            " failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    if (!stderr_path.empty() && freopen(stderr_path.c_str(), "a", stderr) == nullptr) _exit(126);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace strata
