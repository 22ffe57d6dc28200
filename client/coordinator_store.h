// CoordinatorStore: a gloo::rendezvous::Store over the coordinator's
// key-value RPCs, with every key under a prefix. Gloo expects failures as
// exceptions: errors and time-outs throw gloo::IoException, which the
// collectives turn into absl::Status. Thread-safe (the stub is).
#ifndef STRATA_CLIENT_COORDINATOR_STORE_H_
#define STRATA_CLIENT_COORDINATOR_STORE_H_

#include <gloo/rendezvous/store.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/v1/coordinator.grpc.pb.h"

#include "rpc/tls.h"

namespace strata {

class CoordinatorStore : public gloo::rendezvous::Store {
 public:
  // `abandon` (may be empty) is polled while waiting and once the keys are
  // there: true ends the wait with ABORTED. Every wait lasts at least
  // `min_wait`, whatever timeout gloo asks for (its context's timeout also
  // bounds its connecting; see gloo_collective.cc).
  CoordinatorStore(const std::string& coordinator_address, const ChannelCredentials& credentials,
                   std::string prefix, std::function<bool()> abandon = {},
                   absl::Duration min_wait = absl::ZeroDuration());

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits (default timeout) for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Status-returning forms for strata's own use.
  absl::Status Set(const std::string& key, const std::string& value);
  // NOT_FOUND when absent.
  absl::StatusOr<std::string> Get(const std::string& key);
  // DEADLINE_EXCEEDED naming the first missing key after `timeout` (or
  // `min_wait`); ABORTED when abandoned, also with every key there.
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string prefix_;
  const std::function<bool()> abandon_;
  const absl::Duration min_wait_;
};

}  // namespace strata

#endif  // STRATA_CLIENT_COORDINATOR_STORE_H_
