#include "client/step_exchange.h"

#include <algorithm>
#include <utility>

#include <grpcpp/channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/step_wire.h"

namespace strata {
namespace {

// A call refused by a restarting server waits this long before its second
// send, twice as long before each next one, at most kMaxResendDelay.
constexpr absl::Duration kFirstResendDelay = absl::Milliseconds(20);
constexpr absl::Duration kMaxResendDelay = absl::Seconds(1);
// While a call waits for its channel, the channel tries to connect this
// often. Bounded in time by the exchange's deadline, and in
// practice by the coordinator's server timeout, after which a server that
// stays away is declared lost and the exchange is cancelled.
constexpr absl::Duration kReconnectPoll = absl::Milliseconds(20);

absl::Duration ResendDelay(int attempts) {
  absl::Duration delay = kFirstResendDelay;
  for (int i = 1; i < attempts && delay < kMaxResendDelay; ++i) delay *= 2;
  return std::min(delay, kMaxResendDelay);
}

// A server that stops refuses new calls with UNAVAILABLE and cancels those
// it still has; one that is not listening yet fails them with UNAVAILABLE.
bool ServerRestarting(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsCancelled(s);
}

}  // namespace

StepExchange::StepExchange(const std::string& job_id, DType dtype, const StepTransfer& transfer)
    : job_id_(job_id),
      dtype_(dtype),
      esize_(DTypeSize(dtype)),
      transfer_(transfer),
      deadline_(absl::Now() + transfer.timeout) {
  const size_t num_pieces = transfer.pieces->size();
  absl::MutexLock lock(&mu_);
  pushes_.pushes = true;
  for (size_t i = 0; i < num_pieces && transfer.push != nullptr; ++i) {
    for (size_t copy = 0; copy < (*transfer.pieces)[i].copies.size(); ++copy) {
      Call& call = pushes_.calls.emplace_back();
      call.piece = i;
      call.copy = copy;
    }
  }
  pulls_.calls.resize(num_pieces);
  for (size_t i = 0; i < num_pieces; ++i) pulls_.calls[i].piece = i;
}

uint64_t StepExchange::Bytes(const Call& call) const {
  return (*transfer_.pieces)[call.piece].n * esize_;
}

absl::Status StepExchange::Run() {
  absl::MutexLock lock(&mu_);
  StartMore();
  auto done_or_resend = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == 0 || !resend_.empty();
  };
  auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !error_.ok(); };
  while (true) {
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_or_resend), kReconnectPoll)) {
      HurryReconnects();
      continue;
    }
    if (resend_.empty()) break;  // pending_ == 0
    std::vector<std::pair<Stream*, Call*>> resend;
    resend.swap(resend_);
    int attempts = resend.front().second->attempts;
    for (const auto& [stream, call] : resend) attempts = std::min(attempts, call->attempts);
    // Wakes early when the exchange fails meanwhile.
    mu_.AwaitWithTimeout(absl::Condition(&failed), ResendDelay(attempts));
    for (const auto& [stream, call] : resend) {
      if (error_.ok()) {
        Send(*stream, *call);
      } else {
        End(*stream, *call, absl::OkStatus());
      }
    }
  }
  return error_;
}

void StepExchange::Cancel(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  Fail(why);
}

void StepExchange::Fail(const absl::Status& s) {
  if (!error_.ok()) return;
  error_ = s;
  // No point waiting for pulls of a step that cannot complete.
  for (Stream* stream : {&pushes_, &pulls_}) {
    for (Call& call : stream->calls) {
      if (call.context != nullptr) call.context->TryCancel();
    }
  }
}

void StepExchange::HurryReconnects() {
  for (const auto& [channel, calls] : sent_) {
    if (channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      grpc::experimental::ChannelResetConnectionBackoff(channel);
    }
  }
}

void StepExchange::StartMore() {
  for (Stream* stream : {&pushes_, &pulls_}) {
    while (error_.ok() && stream->next < stream->calls.size()) {
      Call& call = stream->calls[stream->next];
      const uint64_t bytes = Bytes(call);
      if (stream->bytes > 0 && stream->bytes + bytes > transfer_.window_bytes) break;
      stream->bytes += bytes;
      ++stream->next;
      ++pending_;
      Send(*stream, call);
    }
  }
}

void StepExchange::Send(Stream& stream, Call& call) {
  const Piece& piece = (*transfer_.pieces)[call.piece];
  const ServerStubs& server = piece.copies[call.copy];
  ++call.attempts;
  ++sent_[server.channel];
  call.context = std::make_unique<grpc::ClientContext>();
  call.context->set_deadline(absl::ToChronoTime(deadline_));
  call.context->set_wait_for_ready(true);  // a restarting server is waited for
  auto done = [this, &stream, &call](grpc::Status s) { OnDone(stream, call, FromGrpcStatus(s)); };
  if (stream.pushes) {
    const PushScalars& push = *transfer_.push;
    v1::PushRequest& request = call.push_request;
    if (call.attempts == 1) {
      request.set_job_id(job_id_);
      request.set_step(transfer_.step);
      request.set_generation(transfer_.generation);
      request.set_attempt(transfer_.attempt);
      request.set_flat_begin(piece.begin);
      request.set_num_params(piece.n);
      request.set_dtype(DTypeToProto(dtype_));
      request.set_coef(push.coef);
      *request.mutable_loss_scale_after() = push.loss_scale_after;
      if (push.lr.has_value()) request.set_lr(*push.lr);
      request.mutable_group_lrs()->Add(push.group_lrs.begin(), push.group_lrs.end());
    }
    call.request = PushRequestBuffer(
        request, transfer_.grads + (piece.begin - transfer_.grads_base) * esize_, Bytes(call));
    server.generic->UnaryCall(call.context.get(), kPushMethod, grpc::StubOptions(), &call.request,
                              &call.response, std::move(done));
  } else {
    v1::PullRequest& request = call.pull_request;
    request.set_job_id(job_id_);
    request.set_step(transfer_.step);
    request.set_flat_begin(piece.begin);
    request.set_num_params(piece.n);
    call.request = MessageBuffer(request);
    server.generic->UnaryCall(call.context.get(), kPullMethod, grpc::StubOptions(), &call.request,
                              &call.response, std::move(done));
  }
}

void StepExchange::OnDone(Stream& stream, Call& call, absl::Status s) {
  const Piece& piece = (*transfer_.pieces)[call.piece];
  const ServerStubs& server = piece.copies[call.copy];
  if (!stream.pushes) s = TakePull(call, std::move(s));
  absl::MutexLock lock(&mu_);
  if (auto it = sent_.find(server.channel); --it->second == 0) sent_.erase(it);
  if (error_.ok() && ServerRestarting(s) && absl::Now() + ResendDelay(call.attempts) < deadline_) {
    // Any copy serves a pull; every copy must see a push.
    if (!stream.pushes) call.copy = (call.copy + 1) % piece.copies.size();
    resend_.emplace_back(&stream, &call);
    return;
  }
  End(stream, call, WithShardAddress(s, server.address));
}

void StepExchange::End(Stream& stream, Call& call, const absl::Status& s) {
  if (!s.ok()) Fail(s);
  stream.bytes -= Bytes(call);
  --pending_;
  StartMore();
}

absl::Status StepExchange::TakePull(Call& call, absl::Status s) const {
  if (!s.ok()) return s;
  const Piece& piece = (*transfer_.pieces)[call.piece];
  int64_t step;
  absl::Status read = ReadPullResponse(
      &call.response, &step, transfer_.params + (piece.begin - transfer_.params_base) * esize_,
      Bytes(call));
  if (read.ok() && step != transfer_.step) {
    read = absl::InternalError(absl::StrCat("a pull returned step ", step));
  }
  if (!read.ok()) {
    return absl::Status(read.code(),
                        absl::StrCat("pull of [", piece.begin, ", +", piece.n, ") of step ",
                                     transfer_.step, ": ", read.message()));
  }
  return absl::OkStatus();
}

}  // namespace strata
