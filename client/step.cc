// ClientImpl (client_impl.h): the step -- reduce-scatter, gradient
// statistics, push and pull of the worker's slice, all-gather; streamed or
// not -- and the on-demand gathers.

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/buckets.h"
#include "client/client_impl.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "kernels/grad_stats.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

// Step(GradientFn) computes a step at most this often (overflows, lost workers).
constexpr int kMaxStepAttempts = 64;

}  // namespace

absl::Status ClientImpl::PushPull(int64_t step, const PushScalars* push) {
  StepTransfer transfer;
  transfer.step = step;
  transfer.generation = generation_.number();
  transfer.attempt = Attempt();
  transfer.pieces = &slice_pieces_;
  transfer.push = push;
  const FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
  transfer.grads = grads_.Slice();
  transfer.grads_base = slice.begin;
  // Pulled into params_, or into pulled_ and from there to the device.
  transfer.params = pulled_.empty() ? params_.data() : pulled_.data();
  transfer.params_base = pulled_.empty() ? params_base_ : slice.begin;
  // At least two chunks and a piece, so that a chunk that waits for another
  // worker's pushes never stalls the rest.
  transfer.window_bytes = std::max(options_.max_step_bytes_in_flight,
                                   2 * options_.job.chunk_num_params * esize_ + kMaxPayloadBytes);
  transfer.timeout = options_.step_timeout;
  RETURN_IF_ERROR(transport_.PushPull(transfer));
  if (pulled_.empty()) return absl::OkStatus();
  return device_->Copy(params_.data() + (slice.begin - params_base_) * esize_, pulled_.data(),
                       pulled_.size());
}

uint32_t ClientImpl::Attempt() {
  if (attempt_step_ != step_ || attempt_generation_ != generation_.number()) {
    attempt_ = 0;
    attempt_step_ = step_;
    attempt_generation_ = generation_.number();
  }
  return attempt_;
}

absl::Status ClientImpl::StreamGradients(FlatRange range, absl::Span<const float> grads,
                                         float multiplier) {
  if (collective_ == nullptr) return absl::FailedPreconditionError("gradients after Leave()");
  RETURN_IF_ERROR(CheckOnDevice(grads, "gradients"));
  if (stream_ == nullptr) {
    if (!stream_failure_.ok()) return stream_failure_;
    // Step(GradientFn) followed the generation before it computed the step's
    // micro-batches (whose samples depend on it); Step() follows it here.
    if (!computing_step_) {
      absl::Status checked = DrainGathers();
      if (checked.ok()) checked = FollowGeneration();
      if (!checked.ok()) {
        if (IsRetryable(checked)) stream_failure_ = checked;
        return checked;
      }
    }
    PushStream::Round round;
    round.job_id = options_.job_id;
    round.step = step_ + 1;
    round.generation = generation_.number();
    round.attempt = Attempt();
    round.dtype = options_.job.dtype;
    round.deadline = absl::Now() + options_.step_timeout;
    push_stream_ = std::make_unique<PushStream>(std::move(round));
    membership_->SetStepInFlight(true);
    GradientStream::Context context;
    context.collective = collective_.get();
    context.layout = &layout_;
    context.transport = &transport_;
    context.dtype = options_.job.dtype;
    context.rank = rank_;
    context.world_size = world_size_;
    context.buckets = buckets_;
    context.grads = &grads_;
    context.device = device_.get();
    context.thread = &collective_thread_;
    context.pushes = push_stream_.get();
    stream_ = std::make_unique<GradientStream>(std::move(context));
    ++micro_batches_;
  }
  return stream_->Add(range, grads, multiplier);
}

void ClientImpl::DropStream() {
  if (push_stream_ != nullptr) push_stream_->Cancel();
  stream_.reset();  // waits for its buckets' work
  push_stream_.reset();
  stream_failure_ = absl::OkStatus();
  if (membership_ != nullptr) membership_->SetStepInFlight(false);
}

absl::Status ClientImpl::CommitAndPull(int64_t step, const PushScalars& push) {
  absl::Status s =
      transport_.CommitStep(step, generation_.number(), Attempt(), push, options_.step_timeout);
  if (s.ok()) s = PushPull(step, /*push=*/nullptr);
  // Pulled: every chunk applied the step, so the pushes are answered.
  if (s.ok()) s = push_stream_->Wait();
  return s;
}

absl::Status ClientImpl::PushPullEverywhere(int64_t step, const PushScalars& push, bool streamed) {
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  absl::Cleanup landed = [this] { membership_->SetStepInFlight(false); };
  for (bool first = true;; first = false) {
    membership_->SetStepInFlight(true);
    absl::Status s = streamed && first ? CommitAndPull(step, push) : PushPull(step, &push);
    // NOT_FOUND: the job is not on that server (now): its chunks are moving.
    const bool retryable =
        absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsNotFound(s);
    // ABORTED: a newer generation cut the step (its generation cancelled
    // here, or a server fenced against it); so did a retryable failure once
    // a generation that moved the chunks is heard of (they moved at a step
    // boundary while this step's pushes were still to go).
    const bool cut =
        absl::IsAborted(s) ||
        (retryable && membership_->Latest().placement_version() != generation_.placement_version());
    // {failed and retryable here, cut here, failed for good here, a newer
    // generation or this worker's leave}: every worker acts on the sums.
    double failed[4] = {!s.ok() && retryable && !cut ? 1.0 : 0.0, cut ? 1.0 : 0.0,
                        !s.ok() && !retryable && !cut ? 1.0 : 0.0,
                        leave_announced_ || NewerGenerationHeard() ? 1.0 : 0.0};
    RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(failed)));
    if (failed[0] == 0 && failed[1] == 0 && failed[2] == 0) {
      reform_agreed_ = failed[3] > 0;
      return absl::OkStatus();
    }
    if (failed[2] > 0 || absl::Now() > deadline) {
      return s.ok() ? absl::AbortedError(absl::StrCat("step ", step, " failed at another worker"))
                    : s;
    }
    if (failed[1] > 0) {
      // A streamed step's pushes still open were cut too: the step is
      // pushed again whole, maybe to other servers.
      DropStream();
      ASSIGN_OR_RETURN(const bool followed, FollowInPlace(/*in_step=*/true));
      if (!followed) {  // re-formed: ABORTED, retryable, whatever cut it here
        return absl::AbortedError(absl::StrCat(
            "step ", step, " was cut ", s.ok() ? "at another worker" : "here: ", s.message()));
      }
      continue;
    }
    LogEventCat("client", "step ", step, ": ",
                s.ok() ? std::string("another worker's push or pull failed") : s.ToString(),
                "; pushing and pulling it again");
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<StepResult> ClientImpl::RunStep(double divisor) {
  const DType dtype = options_.job.dtype;
  StepResult result;
  result.generation = generation_.number();
  result.world_size = static_cast<int>(world_size_);
  absl::Time started = absl::Now();
  const bool streamed = stream_ != nullptr;
  std::vector<GradStats> per_bucket;
  if (streamed) {
    ASSIGN_OR_RETURN(per_bucket, stream_->Finish());
  } else {
    ASSIGN_OR_RETURN(uint8_t * whole, grads_.Whole());
    RETURN_IF_ERROR(collective_->ReduceScatterSum(dtype, whole, padded_num_params_));
    const FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
    RETURN_IF_ERROR(grads_.KeepReduced(slice, whole + slice.begin * esize_));
    per_bucket = SliceGradStats(buckets_, slice, dtype, grads_.Slice());
  }
  const GradStats stats = SumGradStats(per_bucket);
  // {sum of squares, not finite, a newer generation heard of (for a skipped step)}
  double global[3] = {stats.sum_squares, stats.all_finite ? 0.0 : 1.0,
                      NewerGenerationHeard() ? 1.0 : 0.0};
  RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(global)));
  result.collective_seconds = absl::ToDoubleSeconds(absl::Now() - started);

  result.loss_scale = scaler_.scale();
  divisor *= scaler_.scale();
  micro_batches_ = 0;
  if (global[1] > 0) {  // some worker saw Inf or NaN: skip, lower the scale
    // The servers drop what was pushed when the next try's pushes come.
    Attempt();
    ++attempt_;
    DropStream();
    RETURN_IF_ERROR(grads_.Clear());
    scaler_.Update(/*overflow=*/true);
    reform_agreed_ = global[2] > 0;
    result.step = step_;
    result.skipped = true;
    result.grad_norm = INFINITY;
    return result;
  }
  result.grad_norm = std::sqrt(global[0]) / divisor;
  if (options_.max_grad_norm > 0 && result.grad_norm > options_.max_grad_norm) {
    result.clip_factor = options_.max_grad_norm / (result.grad_norm + 1e-6);
  }
  PushScalars push;
  push.coef = static_cast<float>(result.clip_factor / divisor);
  push.lr = lr_;
  push.group_lrs = group_lrs_;
  // The scaler after this step, kept with it by the chunks for checkpoints.
  LossScaler after = scaler_;
  after.Update(/*overflow=*/false);
  push.loss_scale_after.set_scale(after.scale());
  push.loss_scale_after.set_good_steps(after.good_steps());
  started = absl::Now();
  RETURN_IF_ERROR(PushPullEverywhere(step_ + 1, push, streamed));
  result.push_pull_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  DropStream();
  RETURN_IF_ERROR(grads_.Clear());
  if (!on_demand()) {  // the all-gather goes on while the trainer starts the next step
    ParamStream::Context context;
    context.collective = collective_.get();
    context.layout = &layout_;
    context.dtype = dtype;
    context.rank = rank_;
    context.world_size = world_size_;
    context.buckets = buckets_;
    context.params = params_.data();
    context.device = device_.get();
    context.scratch = &param_stream_scratch_;
    context.thread = &collective_thread_;
    param_stream_ = std::make_unique<ParamStream>(std::move(context));
  }
  scaler_.Update(/*overflow=*/false);
  result.step = ++step_;
  membership_->Running(generation_, step_);
  return result;
}

absl::Status ClientImpl::FinishParamStream() {
  if (param_stream_ == nullptr) return absl::OkStatus();
  absl::Status s = param_stream_->WaitAll();
  param_stream_.reset();
  return s;
}

absl::Status ClientImpl::DrainGathers() {
  absl::Status s = FinishParamStream();
  absl::Status gathered = gatherer_.Drain();
  if (s.ok()) s = gathered;
  if (s.ok()) s = stream_failure_;
  if (IsRetryable(s)) broken_ = true;
  return s;
}

std::unique_ptr<PendingGather> ClientImpl::StartGather(FlatRange range, absl::Span<float> out) {
  absl::Status refused;
  if (range.begin > range.end || range.end > layout_.num_params()) {
    refused = absl::InvalidArgumentError(absl::StrCat("gather of [", range.begin, ", ", range.end,
                                                      "): the flat space is [0, ",
                                                      layout_.num_params(), ")"));
  } else if (out.size() != range.size()) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("gather of ", range.size(), " parameters into ", out.size(), " floats"));
  } else if (collective_ == nullptr) {
    refused = absl::FailedPreconditionError("gather after Leave()");
  } else if (absl::Status on_device = CheckOnDevice(out, "gathered floats"); !on_device.ok()) {
    refused = on_device;
  } else if (!on_demand()) {
    refused = param_stream_ == nullptr ? absl::OkStatus() : param_stream_->WaitFor(range);
    if (refused.ok()) {
      refused = device_->CastToFloat(options_.job.dtype, params_.data() + range.begin * esize_,
                                     out.data(), out.size());
    } else if (IsRetryable(refused)) {
      broken_ = true;
    }
  } else {
    ParamGatherer::Source source;
    source.collective = collective_.get();
    source.layout = &layout_;
    source.dtype = options_.job.dtype;
    source.rank = rank_;
    source.world_size = world_size_;
    source.slice = layout_.WorkerSlice(rank_, world_size_);
    source.slice_bytes = params_.data();
    source.device = device_.get();
    return gatherer_.Start(source, range, out);
  }
  return ParamGatherer::Done(refused);
}

absl::StatusOr<StepResult> ClientImpl::Step() {
  if (micro_batches_ == 0) {
    return absl::FailedPreconditionError("Step() with no accumulated gradients");
  }
  absl::StatusOr<StepResult> result = [&]() -> absl::StatusOr<StepResult> {
    RETURN_IF_ERROR(DrainGathers());
    // A streamed step followed the generation at its first range.
    if (stream_ == nullptr) RETURN_IF_ERROR(FollowGeneration());
    return RunStep(static_cast<double>(world_size_) * micro_batches_);
  }();
  if (!result.ok()) {
    broken_ = broken_ || IsRetryable(result.status());
    DropStream();
    micro_batches_ = 0;
    // Gradients that could not be zeroed must not reach the next step.
    RETURN_IF_ERROR(grads_.Clear());
  }
  return result;
}

absl::StatusOr<StepResult> ClientImpl::Step(const GradientFn& compute) {
  const uint64_t batch = options_.job.samples_per_step;
  if (batch == 0) {
    return absl::FailedPreconditionError("Step(GradientFn) needs samples_per_step > 0");
  }
  int64_t target = step_ + 1;
  for (int attempt = 1;; ++attempt) {
    RETURN_IF_ERROR(FollowGeneration());
    // The job resumed from an older checkpoint: the step after it.
    target = std::min(target, step_ + 1);
    const uint64_t first = static_cast<uint64_t>(target - 1) * batch;
    if (step_ >= target) {  // the others completed it while this worker re-formed
      StepResult done;
      done.step = step_;
      done.generation = generation_.number();
      done.world_size = static_cast<int>(world_size_);
      done.loss_scale = scaler_.scale();
      done.attempts = attempt;
      done.sample_begin = static_cast<uint64_t>(step_ - 1) * batch;
      done.sample_end = done.sample_begin + batch;
      return done;
    }
    const uint64_t begin = first + batch * rank_ / world_size_;
    const uint64_t end = first + batch * (rank_ + 1) / world_size_;
    const uint64_t micro = options_.micro_batch_samples > 0 ? options_.micro_batch_samples
                                                            : std::max<uint64_t>(end - begin, 1);
    DropStream();
    RETURN_IF_ERROR(grads_.Clear());
    micro_batches_ = 0;
    absl::Status computed;
    computing_step_ = true;
    for (uint64_t b = begin; b < end && computed.ok(); b += micro) {
      computed = compute(MicroBatch{target, b, std::min(end, b + micro)}, *this);
    }
    computing_step_ = false;
    // A failed gather (a lost worker) is why compute failed, if it did: the
    // step is recomputed in the next generation. Compute's own errors end it.
    absl::Status gathered = DrainGathers();
    if (gathered.ok() && !computed.ok()) return computed;
    absl::StatusOr<StepResult> result =
        gathered.ok() ? RunStep(static_cast<double>(batch)) : absl::StatusOr<StepResult>(gathered);
    if (result.ok() && !result->skipped) {
      result->attempts = attempt;
      result->sample_begin = first;
      result->sample_end = first + batch;
      return result;
    }
    if (attempt >= kMaxStepAttempts) {
      return result.ok()
                 ? absl::FailedPreconditionError(absl::StrCat(
                       "step ", target, " overflowed ", attempt, " times; the loss scale is ",
                       scaler_.scale(), " (are the gradients finite?)"))
                 : result.status();
    }
    if (result.ok()) continue;  // overflow: the same samples at a lower scale
    if (!IsRetryable(result.status())) return result.status();
    RETURN_IF_ERROR(Recover(result.status()));
  }
}

}  // namespace strata
