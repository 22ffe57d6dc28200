#include "client/push_stream.h"

#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/step_wire.h"

namespace strata {

PushStream::~PushStream() {
  Cancel();
  Wait().IgnoreError();
}

void PushStream::Send(const Piece& piece, const uint8_t* grads) {
  v1::PushRequest request;
  request.set_job_id(round_.job_id);
  request.set_step(round_.step);
  request.set_generation(round_.generation);
  request.set_attempt(round_.attempt);
  request.set_scalars_follow(true);
  request.set_flat_begin(piece.begin);
  request.set_num_params(piece.n);
  request.set_dtype(DTypeToProto(round_.dtype));
  // One serialization for every copy: the calls share its slices.
  const grpc::ByteBuffer buffer =
      PushRequestBuffer(request, grads, piece.n * DTypeSize(round_.dtype));
  absl::MutexLock lock(&mu_);
  for (const ServerStubs& server : piece.copies) {
    Call& call = calls_.emplace_back();
    ++pending_;
    call.context.set_deadline(absl::ToChronoTime(round_.deadline));
    call.request = buffer;
    server.generic->UnaryCall(&call.context, kPushMethod, grpc::StubOptions(), &call.request,
                              &call.response,
                              [this, address = server.address](grpc::Status status) {
                                absl::Status s = WithShardAddress(FromGrpcStatus(status), address);
                                absl::MutexLock lock(&mu_);
                                if (error_.ok()) error_ = s;
                                --pending_;
                              });
  }
}

absl::Status PushStream::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  return error_;
}

void PushStream::Cancel() {
  absl::MutexLock lock(&mu_);
  for (Call& call : calls_) call.context.TryCancel();
}

}  // namespace strata
