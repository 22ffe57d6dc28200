// Test helpers for tests that run real processes: Spawn() starts a binary
// with its stderr in a log file, Processes kills (SIGKILL) and reaps whatever
// is left when the test ends however it ends, WaitReady() reads the address a
// daemon writes to its --ready_file, StartCoordinator() and StartServer() do
// both for the daemons, RunCommand() runs a shell command for its output.
#ifndef STRATA_TESTING_PROCESSES_H_
#define STRATA_TESTING_PROCESSES_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "core/subprocess.h"
#include "gtest/gtest.h"

namespace strata::testing {

// Starts `args[0]` with `args`, stderr appended to `log`; returns its pid
// (> 0). A test that cannot fork ends here: a pid of -1 handed on would
// signal every process at the test's first kill().
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  absl::StatusOr<pid_t> pid = SpawnProcess(args, log);
  if (!pid.ok()) {
    std::fprintf(stderr, "testing::Spawn: %s\n", pid.status().ToString().c_str());
    std::abort();
  }
  return *pid;
}

// The exit status of `pid` (waitpid's), or -1 when it is not done within
// `timeout` (it is then left running).
inline int WaitExit(pid_t pid, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

// Processes started by a test, killed when it ends.
struct Processes {
  ~Processes() {
    for (pid_t pid : pids) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Forgets a process the test reaped itself.
  void Forget(pid_t pid) { pids.erase(std::remove(pids.begin(), pids.end(), pid), pids.end()); }
  std::vector<pid_t> pids;
};

// The first word of `file` once it has one (a daemon's --ready_file), or ""
// after 30 s.
inline std::string WaitReady(const std::string& file) {
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(file);
    std::string address;
    if (in >> address) return address;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return "";
}

// Starts `bin`/strata-coordinator with its data, log and ready file in `dir`,
// checkpoints anywhere in `dir`, and `extra` flags, under `launcher` (a
// command that runs the rest of its arguments, as `ip netns exec NS` does;
// none: directly); returns its address ("" when it did not come up).
inline std::string StartCoordinator(const std::string& bin, const std::string& dir,
                                    Processes* processes,
                                    const std::vector<std::string>& extra = {},
                                    const std::vector<std::string>& launcher = {}) {
  std::vector<std::string> args = launcher;
  for (std::string arg : {bin + "/strata-coordinator", std::string("--listen=127.0.0.1:0"),
                          "--data_dir=" + dir + "/coordinator", "--checkpoint_root=" + dir,
                          "--ready_file=" + dir + "/coordinator.addr"}) {
    args.push_back(std::move(arg));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  processes->pids.push_back(Spawn(args, dir + "/coordinator.log"));
  return WaitReady(dir + "/coordinator.addr");
}

// A strata-server started by StartServer().
struct ServerProcess {
  pid_t pid = -1;
  std::string address;  // "" when it did not come up
};

// Starts `bin`/strata-server `name` (data in `dir`/name, log and ready file
// beside it) for `coordinator`, no GPU tier (on a machine with a GPU too),
// unpinned host memory, one executor thread (and one for NVMe chunks), no
// memory kept for checkpoint copies, checkpoints anywhere in `dir`, and `extra` flags (which may
// override these), under `launcher` (as StartCoordinator's). A ready file left by an earlier
// server of that name (a restart on the same directory) is removed first, so that the new
// server's address is awaited.
inline ServerProcess StartServer(const std::string& bin, const std::string& dir,
                                 const std::string& name, const std::string& coordinator,
                                 const std::vector<std::string>& extra, Processes* processes,
                                 const std::vector<std::string>& launcher = {}) {
  const std::string base = dir + "/" + name;
  std::vector<std::string> args = launcher;
  for (std::string arg :
       {bin + "/strata-server", std::string("--listen=127.0.0.1:0"), "--coordinator=" + coordinator,
        "--data_dir=" + base, std::string("--pin_host_memory=false"),
        std::string("--executor_threads=1"), std::string("--nvme_executor_threads=1"),
        std::string("--checkpoint_buffer_mib=0"), std::string("--gpu_budget_mib=0"),
        "--checkpoint_root=" + dir, "--ready_file=" + base + ".addr"}) {
    args.push_back(std::move(arg));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::remove((base + ".addr").c_str());
  ServerProcess server;
  server.pid = Spawn(args, base + ".log");
  processes->pids.push_back(server.pid);
  server.address = WaitReady(base + ".addr");
  return server;
}

// Runs `command` in a shell; returns its exit status and its stdout and stderr.
inline std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[512];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_PROCESSES_H_
