// ShardService (shard_service.h): the step's RPCs -- Push, CommitStep and
// Pull (raw: its answer holds the pulled bytes once, rpc/step_wire.h) -- and
// the scheduling of a chunk's apply once its step is ready.

#include <grpcpp/alarm.h>

#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/step_wire.h"
#include "shard/shard_service.h"

namespace strata {
void ShardService::ScheduleApply(std::shared_ptr<Chunk> chunk) {
  ThreadPool* executor = chunk->tier() == TierKind::kNvme ? nvme_executor_ : executor_;
  executor->Schedule([this, chunk = std::move(chunk)] {
    absl::Time started = absl::Now();
    chunk->Apply();
    if (apply_seconds_ != nullptr)
      apply_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - started));
    if (absl::Status lost = chunk->lost(); !lost.ok()) {
      LogEventCat("server", lost.message());
      if (on_chunk_lost_) on_chunk_lost_();
    }
  });
}

namespace {

// The scalars of a push or commit request, checked.
template <typename Request>
absl::StatusOr<StepScalars> ValidScalars(const Request& request) {
  if (!std::isfinite(request.coef())) {
    return absl::InvalidArgumentError(absl::StrCat("coef ", request.coef(), " is not finite"));
  }
  if (request.has_lr() && !(std::isfinite(request.lr()) && request.lr() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr ", request.lr(), " must be finite and >= 0"));
  }
  for (int g = 0; g < request.group_lrs_size(); ++g) {
    const float lr = request.group_lrs(g);
    if (!(std::isfinite(lr) && lr >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("group_lrs[", g, "] ", lr, " must be finite and >= 0"));
    }
  }
  StepScalars scalars;
  scalars.coef = request.coef();
  if (request.has_lr()) scalars.lr = request.lr();
  if (request.has_loss_scale_after()) {
    scalars.loss_scale_after = LossScaleFromProto(request.loss_scale_after());
  }
  scalars.group_lrs.assign(request.group_lrs().begin(), request.group_lrs().end());
  return scalars;
}

absl::Status ValidStep(int64_t step) {
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step ", step, " must be >= 1"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<Chunk>> ShardService::ValidatePush(const v1::PushRequest& request,
                                                                  uint64_t grads_bytes) {
  RETURN_IF_ERROR(ValidStep(request.step()));
  if (!request.scalars_follow()) {
    RETURN_IF_ERROR(ValidScalars(request).status());
  }
  ASSIGN_OR_RETURN(DType grad_dtype, DTypeFromProto(request.dtype()));
  DType job_dtype;
  uint64_t min_generation;
  ASSIGN_OR_RETURN(auto chunk, FindChunk(request.job_id(), request.flat_begin(),
                                         request.num_params(), &job_dtype, &min_generation));
  if (request.generation() < min_generation) {
    return absl::AbortedError(absl::StrCat(
        "push of generation ", request.generation(), " to job '", request.job_id(),
        "': its chunks moved here for generation ", min_generation, " on; re-form first"));
  }
  if (grad_dtype != job_dtype) {
    return absl::InvalidArgumentError(absl::StrCat("gradients are ", DTypeName(grad_dtype),
                                                   "; job '", request.job_id(), "' uses ",
                                                   DTypeName(job_dtype)));
  }
  uint64_t want_bytes = request.num_params() * DTypeSize(job_dtype);
  if (grads_bytes != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("grads has ", grads_bytes, " bytes; ",
                                                   request.num_params(), " ", DTypeName(job_dtype),
                                                   " gradients need ", want_bytes));
  }
  return chunk;
}

grpc::ServerUnaryReactor* ShardService::Push(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* raw_request,
                                             grpc::ByteBuffer* response) {
  std::unique_ptr<PushMessage> push = PushMessage::Parse(*raw_request);
  if (push == nullptr) {
    return FinishUnary(ctx, absl::InvalidArgumentError("the push request does not parse"));
  }
  const v1::PushRequest& request = push->fields();
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = ValidatePush(request, push->grads_bytes());
  if (!chunk.ok()) return FinishUnary(ctx, chunk.status());
  if (pushed_bytes_ != nullptr) pushed_bytes_->Increment(push->grads_bytes());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::optional<StepScalars> scalars;
  if (!request.scalars_follow()) {
    scalars = *ValidScalars(request);
  }
  // The chunk reads the gradients where gRPC received them: `push` keeps
  // them until the chunk is done with them.
  const absl::Span<const absl::string_view> grads = push->grads();
  const int64_t step = request.step();
  absl::StatusOr<bool> complete =
      (*chunk)->Stage(step, PushRound{request.generation(), request.attempt()},
                      request.flat_begin(), request.num_params(), grads, std::move(scalars),
                      [reactor, response, step, push = std::move(push)](absl::Status s) {
                        v1::PushResponse answer;
                        answer.set_applied_step(step);
                        *response = MessageBuffer(answer);
                        reactor->Finish(ToGrpcStatus(s));
                      });
  if (!complete.ok()) {
    reactor->Finish(ToGrpcStatus(complete.status()));
  } else if (*complete) {
    ScheduleApply(*std::move(chunk));
  }
  return reactor;
}

absl::Status ShardService::DoCommitStep(const v1::CommitStepRequest& request) {
  RETURN_IF_ERROR(ValidStep(request.step()));
  ASSIGN_OR_RETURN(StepScalars scalars, ValidScalars(request));
  uint64_t min_generation;
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Chunk>> chunks,
                   ChunksOf(request.job_id(), &min_generation));
  if (request.generation() < min_generation) {
    return absl::AbortedError(absl::StrCat(
        "commit of generation ", request.generation(), " to job '", request.job_id(),
        "': its chunks moved here for generation ", min_generation, " on; re-form first"));
  }
  absl::Status first_error;
  for (std::shared_ptr<Chunk>& chunk : chunks) {
    if (chunk->awaiting_seed()) continue;  // a new copy, in no placement yet
    absl::StatusOr<bool> ready =
        chunk->Commit(request.step(), PushRound{request.generation(), request.attempt()}, scalars);
    if (!ready.ok()) {
      first_error.Update(ready.status());
    } else if (*ready) {
      ScheduleApply(std::move(chunk));
    }
  }
  return first_error;
}

grpc::ServerUnaryReactor* ShardService::CommitStep(grpc::CallbackServerContext* ctx,
                                                   const v1::CommitStepRequest* request,
                                                   v1::CommitStepResponse*) {
  return FinishUnary(ctx, DoCommitStep(*request));
}

namespace {

// A Pull whose answer may wait for the chunk's next step: the caller's
// cancellation (or deadline) ends the wait and frees its place on the chunk.
// The handler calls Waiting() once, after the chunk's Pull() returned; the
// reactor deletes itself after that and OnDone(), whichever comes last (the
// answer may be sent, and the call done, before Pull() returns).
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit PullReactor(std::shared_ptr<Chunk> chunk) : chunk_(std::move(chunk)) {}

  // Alive until Finish(): what an answer keeps while gRPC sends it.
  const std::shared_ptr<Chunk>& chunk() const { return chunk_; }

  // `ticket`: what the chunk's Pull() returned; a pull that waits is ended
  // after `max_wait` (DEADLINE_EXCEEDED) if nothing ended it before.
  void Waiting(uint64_t ticket, absl::Duration max_wait) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      ticket_ = ticket;
      cancelled = cancelled_;
    }
    if (cancelled && ticket != 0) chunk_->CancelPull(ticket, Cancelled());
    if (!cancelled && ticket != 0) {
      // Holds the chunk, not the reactor: the alarm may fire after the
      // answer, when the reactor is gone (the ticket then ends nothing).
      max_wait_.Set(absl::ToChronoTime(absl::Now() + max_wait), [chunk = chunk_, ticket,
                                                                 max_wait](bool fired) {
        if (!fired) return;
        chunk->CancelPull(ticket, absl::DeadlineExceededError(absl::StrCat(
                                      "the pull waited ", absl::FormatDuration(max_wait),
                                      " for its step, the most a pull may")));
      });
    }
    Unref();
  }

  void OnCancel() override {
    uint64_t ticket;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      ticket = ticket_;
    }
    if (ticket != 0) chunk_->CancelPull(ticket, Cancelled());
  }
  void OnDone() override { Unref(); }

 private:
  static absl::Status Cancelled() {
    return absl::CancelledError("the pull was cancelled by its caller");
  }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  const std::shared_ptr<Chunk> chunk_;
  grpc::Alarm max_wait_;
  std::atomic<int> refs_{2};  // the handler's and gRPC's
  absl::Mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* ShardService::Pull(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* raw_request,
                                             grpc::ByteBuffer* response) {
  v1::PullRequest request;
  if (!ParseMessageBuffer(*raw_request, &request)) {
    return FinishUnary(ctx, absl::InvalidArgumentError("the pull request does not parse"));
  }
  DType dtype;
  absl::StatusOr<std::shared_ptr<Chunk>> chunk =
      FindChunk(request.job_id(), request.flat_begin(), request.num_params(), &dtype);
  if (!chunk.ok()) return FinishUnary(ctx, chunk.status());
  auto* reactor = new PullReactor(*chunk);
  const uint64_t ticket = (*chunk)->Pull(
      request.step(), request.flat_begin(), request.num_params(),
      [this, reactor, response, dtype, snapshot = request.snapshot()](absl::Status s, int64_t step,
                                                                      absl::string_view bytes) {
        if (s.ok() && pulled_bytes_ != nullptr) pulled_bytes_->Increment(bytes.size());
        if (s.ok()) {
          // A worker's answer is sent from the chunk's copy, which stays as
          // it is until the worker has received it (Chunk::PullDone).
          *response = PullResponseBuffer(step, DTypeToProto(dtype), bytes.data(), bytes.size(),
                                         snapshot ? nullptr : answers_->Hold(reactor->chunk()));
        }
        reactor->Finish(ToGrpcStatus(s));
      });
  reactor->Waiting(ticket, max_pull_wait_);
  return reactor;
}

}  // namespace strata
