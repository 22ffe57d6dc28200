// HostNetwork: an emulated network of hosts for one test --
// testing/host_network.sh's network namespaces, one per host, each with its
// own address and a shaped link to a router, brought up by Up() and removed
// with everything in them by the destructor (and by the script's `down`
// after a run that was interrupted). The test itself reaches every host
// through the machine's own namespace ("ctl"). Needs root and the tools of
// `deploy/install-deps.sh --hosts`; Available() says whether this machine
// has them.
//
// Thread-compatible: one test drives it.
#ifndef STRATA_TESTING_HOST_NETWORK_H_
#define STRATA_TESTING_HOST_NETWORK_H_

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "testing/processes.h"

namespace strata::testing {

class HostNetwork {
 public:
  // OK where this process may create namespaces and has the script's tools;
  // otherwise why not.
  static absl::Status Available() {
    if (geteuid() != 0) return absl::FailedPreconditionError("needs root (network namespaces)");
    auto [status, output] = RunCommand("command -v ip tc nft iptables-legacy ethtool");
    if (status != 0) {
      return absl::FailedPreconditionError(
          "needs ip, tc, nft, iptables-legacy and ethtool (deploy/install-deps.sh --hosts)");
    }
    return absl::OkStatus();
  }

  // Brings up `hosts` with link profile `profile` ("cluster" or "slow"),
  // named after this process ($STRATA_NET_PREFIX where set, so that a
  // wrapper script knows what to remove).
  static absl::StatusOr<std::unique_ptr<HostNetwork>> Up(const std::string& profile,
                                                         const std::vector<std::string>& hosts) {
    const char* given = std::getenv("STRATA_NET_PREFIX");
    std::string prefix = given != nullptr ? given : absl::StrCat("st", getpid() % 1000000);
    std::unique_ptr<HostNetwork> network(new HostNetwork(std::move(prefix)));
    RETURN_IF_ERROR(network->Run(
        absl::StrCat("up ", network->prefix_, " ", profile, " ", absl::StrJoin(hosts, " "))));
    network->up_ = true;
    return network;
  }

  ~HostNetwork() {
    if (up_) Run("down " + prefix_).IgnoreError();
  }
  HostNetwork(const HostNetwork&) = delete;
  HostNetwork& operator=(const HostNetwork&) = delete;

  // The address of `host` in the test network.
  std::string Address(const std::string& host) {
    auto [status, output] = RunCommand(Script() + " address " + prefix_ + " " + host);
    return status == 0 ? std::string(absl::StripTrailingAsciiWhitespace(output)) : "";
  }
  // The command that runs the rest of its arguments on `host` (its first
  // word a path, as SpawnProcess() takes it).
  std::vector<std::string> Launcher(const std::string& host) const {
    return {"/usr/bin/env", "ip", "netns", "exec", prefix_ + "-" + host};
  }
  // Drops every packet between `a` and `b` until Heal(a, b).
  absl::Status Cut(const std::string& a, const std::string& b) {
    return Run(absl::StrCat("cut ", prefix_, " ", a, " ", b));
  }
  absl::Status Heal(const std::string& a, const std::string& b) {
    return Run(absl::StrCat("heal ", prefix_, " ", a, " ", b));
  }

 private:
  explicit HostNetwork(std::string prefix) : prefix_(std::move(prefix)) {}

  static std::string Script() {
    return absl::StrCat("NET_DELAY=", STRATA_TEST_BIN_DIR, "/net_delay ", STRATA_SOURCE_DIR,
                        "/testing/host_network.sh");
  }
  absl::Status Run(const std::string& arguments) {
    auto [status, output] = RunCommand(Script() + " " + arguments);
    if (status != 0) {
      return absl::InternalError(absl::StrCat("host_network.sh ", arguments, ": ", output));
    }
    return absl::OkStatus();
  }

  const std::string prefix_;
  bool up_ = false;
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_HOST_NETWORK_H_
