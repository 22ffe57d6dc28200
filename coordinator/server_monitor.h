// ServerMonitor: the coordinator's watch over the shard servers. A
// background thread asks each watched server's standard gRPC health service
// every `interval`; a server that has not answered SERVING for longer than
// `timeout` is lost: `on_lost(address)` runs, on the monitor's thread, and
// again at every later check while it stays lost (so that work it could not
// finish is retried). A lost server that answers again is back:
// `on_back(address)` runs once. Watch() (a registration) makes a server
// healthy without on_back: the registrar deals with a registering server.
// `on_round()` runs after every round of checks and callbacks.
//
// Silence from everyone is no evidence against a server: while the
// coordinator has heard from no worker or server (`reachability`) for half
// a timeout, it may be the one cut off, and it declares no server lost; once
// it hears again, every server has a whole timeout to answer.
//
// Thread-safe. The callbacks run on the monitor's thread, one at a time, and
// may block; they must not call Stop().
#ifndef STRATA_COORDINATOR_SERVER_MONITOR_H_
#define STRATA_COORDINATOR_SERVER_MONITOR_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/reachability.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/tls.h"

namespace strata {

class ServerMonitor {
 public:
  using Callback = std::function<void(const std::string& address)>;
  // Checks health over channels made with `credentials`; a healthy answer
  // counts in `reachability`, which outlives the monitor.
  ServerMonitor(absl::Duration interval, absl::Duration timeout, ChannelCredentials credentials,
                Reachability* reachability, Callback on_lost, Callback on_back,
                std::function<void()> on_round);
  ~ServerMonitor();  // Stop()s
  ServerMonitor(const ServerMonitor&) = delete;
  ServerMonitor& operator=(const ServerMonitor&) = delete;

  // Watches `address` from now on, as healthy (a registration).
  void Watch(const std::string& address);
  bool IsLost(const std::string& address) const;
  // Ends the thread; no callback runs after it returns.
  void Stop();

 private:
  struct Server {
    std::unique_ptr<grpc::health::v1::Health::Stub> stub;
    absl::Time last_healthy;
    bool lost = false;
  };
  void Loop();
  // Health-checks every server; returns the lost ones and those back.
  void CheckAll(std::vector<std::string>* lost, std::vector<std::string>* back);

  const absl::Duration interval_;
  const absl::Duration timeout_;
  const ChannelCredentials credentials_;
  Reachability* const reachability_;
  const Callback on_lost_, on_back_;
  const std::function<void()> on_round_;
  mutable absl::Mutex mu_;
  std::map<std::string, Server> servers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool isolated_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_SERVER_MONITOR_H_
