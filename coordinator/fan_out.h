// FanOut: one asynchronous unary call to each of several servers, with one
// completion when all have answered. Used by the coordinator so that its
// reactors never block on another server. Thread-safe; `done` runs once, on
// a gRPC thread.
#ifndef STRATA_COORDINATOR_FAN_OUT_H_
#define STRATA_COORDINATOR_FAN_OUT_H_

#include <grpcpp/client_context.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rpc/grpc_status.h"

namespace strata {

template <typename Response>
struct FanOutResult {
  std::string address;
  absl::Status status;  // the message names the address when not OK
  Response response;
  grpc::ClientContext context;
};

// `start(address, context, response, on_reply)` starts the call to `address`;
// `done(results)` receives every result, in the order of `addresses`.
template <typename Response>
void FanOut(const std::vector<std::string>& addresses, absl::Duration timeout,
            std::function<void(const std::string&, grpc::ClientContext*, Response*,
                               std::function<void(grpc::Status)>)>
                start,
            std::function<void(std::vector<std::unique_ptr<FanOutResult<Response>>>&)> done) {
  struct State {
    std::vector<std::unique_ptr<FanOutResult<Response>>> results;
    std::atomic<size_t> pending{0};
    std::function<void(std::vector<std::unique_ptr<FanOutResult<Response>>>&)> done;
  };
  auto state = std::make_shared<State>();
  state->done = std::move(done);
  state->pending = addresses.size();
  for (const std::string& address : addresses) {
    state->results.push_back(std::make_unique<FanOutResult<Response>>());
    state->results.back()->address = address;
    state->results.back()->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  if (addresses.empty()) {
    state->done(state->results);
    return;
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    FanOutResult<Response>* r = state->results[i].get();
    start(r->address, &r->context, &r->response, [state, r](grpc::Status s) {
      r->status = WithShardAddress(FromGrpcStatus(s), r->address);
      if (--state->pending == 0) state->done(state->results);
    });
  }
}

// FanOut() for a thread that may block: returns the results once all came.
template <typename Response>
std::vector<std::unique_ptr<FanOutResult<Response>>> FanOutAndWait(
    const std::vector<std::string>& addresses, absl::Duration timeout,
    std::function<void(const std::string&, grpc::ClientContext*, Response*,
                       std::function<void(grpc::Status)>)>
        start) {
  absl::Notification all_done;
  std::vector<std::unique_ptr<FanOutResult<Response>>> out;
  FanOut<Response>(addresses, timeout, std::move(start), [&](auto& results) {
    out = std::move(results);
    all_done.Notify();
  });
  all_done.WaitForNotification();
  return out;
}

}  // namespace strata

#endif  // STRATA_COORDINATOR_FAN_OUT_H_
