// StepExchange: one worker's pushes and pulls of one step
// (ShardTransport::PushPull). Each piece is pushed to every copy of its
// chunk and pulled from one, each by a call of its own; each stream starts
// its calls in flat order within its window of bytes in flight, so that a
// shard server holds a bounded part of the step (a push stays open until
// its chunk is applied, a pull until it is sent).
//
// A call that a restarting server refuses (UNAVAILABLE: shutting down, not
// listening yet; or CANCELLED by the server as it stopped) is sent again to
// the same address after a backoff (20 ms, doubling to 1 s) until the
// exchange's deadline, while the other calls go on (a pull goes to the
// chunk's next copy, if it has another). Every call waits for its
// channel to connect, and a channel with calls waiting tries to connect
// every 20 ms (not on gRPC's growing reconnect backoff), so that they go out
// within 20 ms of their server listening again. A restarted server
// brings its chunks back at the step they had applied, so a push sent again
// is applied (or found applied) and its pulls are answered: each worker
// completes the step by itself, and a clean restart costs the step no more
// than the restart's own time. Any other error ends the exchange: the calls
// in flight are cancelled, none is started or sent again, and Run() returns
// the first error, naming its server.
//
// Thread-safety: Run() is called once, from one thread; Cancel() from any
// thread, before, during or after Run().
#ifndef STRATA_CLIENT_STEP_EXCHANGE_H_
#define STRATA_CLIENT_STEP_EXCHANGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shard_transport.h"
#include "strata/types.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class StepExchange {
 public:
  // `job_id`, `transfer` and what it points to must outlive the exchange.
  // Every call ends by `transfer.timeout` from now.
  StepExchange(const std::string& job_id, DType dtype, const StepTransfer& transfer);
  StepExchange(const StepExchange&) = delete;
  StepExchange& operator=(const StepExchange&) = delete;

  // Returns once every piece is pushed (unless the transfer pulls only) and
  // pulled, or once the exchange failed and its calls in flight ended.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the exchange with `why` (not OK) unless it already ended.
  void Cancel(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const StepTransfer& transfer() const { return transfer_; }

 private:
  struct Call {
    size_t piece = 0;
    size_t copy = 0;   // of the piece's chunk: the server called
    int attempts = 0;  // sends so far
    std::unique_ptr<grpc::ClientContext> context;
    v1::PushRequest push_request;  // the fields but the gradients
    v1::PullRequest pull_request;
    grpc::ByteBuffer request;  // rpc/step_wire.h
    grpc::ByteBuffer response;
  };
  struct Stream {
    bool pushes = false;
    std::vector<Call> calls;  // one per piece
    size_t next = 0;          // the next call to start
    uint64_t bytes = 0;       // bytes of the calls started and not ended
  };

  // Starts the calls the windows allow while no call failed.
  void StartMore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `call` of `stream` (again), with a fresh context.
  void Send(Stream& stream, Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call's outcome: sent again later, or ended with `s`.
  void OnDone(Stream& stream, Call& call, absl::Status s) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends `call`: its bytes leave the window; a failure ends the exchange.
  void End(Stream& stream, Call& call, const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes each channel of sent_ that is not connected try to connect now.
  void HurryReconnects() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pull's outcome: its bytes copied into the transfer's parameters.
  absl::Status TakePull(Call& call, absl::Status s) const;
  uint64_t Bytes(const Call& call) const;

  const std::string& job_id_;
  const DType dtype_;
  const size_t esize_;
  const StepTransfer& transfer_;
  const absl::Time deadline_;

  absl::Mutex mu_;
  Stream pushes_ ABSL_GUARDED_BY(mu_);
  Stream pulls_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // calls started and not ended
  // Calls a restarting server refused, to send again after a backoff.
  std::vector<std::pair<Stream*, Call*>> resend_ ABSL_GUARDED_BY(mu_);
  // Calls sent and not ended, by channel.
  std::map<grpc::Channel*, int> sent_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failure
};

}  // namespace strata

#endif  // STRATA_CLIENT_STEP_EXCHANGE_H_
