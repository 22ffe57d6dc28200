// PushStream: the pushes of one streamed step, sent as backward completes
// their buckets, with the step's scalars to follow (CommitStep). Each push
// stays open until its chunk applies the step. A failed push is recorded,
// not sent again: the step then pushes everything again with its scalars
// (ClientImpl::PushPullEverywhere), and the servers answer the ranges they
// have staged as retries.
//
// Thread-safety: Send() from one thread at a time; Wait() and Cancel() from
// any thread.
#ifndef STRATA_CLIENT_PUSH_STREAM_H_
#define STRATA_CLIENT_PUSH_STREAM_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shard_transport.h"
#include "strata/types.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class PushStream {
 public:
  // Whose pushes these are.
  struct Round {
    std::string job_id;
    int64_t step = 0;
    uint64_t generation = 0;
    uint32_t attempt = 0;
    DType dtype = DType::kFp32;
    absl::Time deadline;  // of every push
  };

  explicit PushStream(Round round) : round_(std::move(round)) {}
  // Cancels the pushes still open and waits for them to end.
  ~PushStream();
  PushStream(const PushStream&) = delete;
  PushStream& operator=(const PushStream&) = delete;

  // Pushes piece.n gradients at `grads` for `piece` to every copy of its
  // chunk; they are sent from
  // there (rpc/step_wire.h) and must stay unchanged until the push ends
  // (the destructor waits for that).
  void Send(const Piece& piece, const uint8_t* grads) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for every push sent to end: the first error, naming its server.
  absl::Status Wait() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the pushes still open (CANCELLED).
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
  };

  const Round round_;
  absl::Mutex mu_;
  std::deque<Call> calls_ ABSL_GUARDED_BY(mu_);  // a deque: calls never move
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_CLIENT_PUSH_STREAM_H_
