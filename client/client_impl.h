// ClientImpl: the Client of strata/client.h. One file per concern: joining
// and leaving the job and writing its initial state (client.cc), forming the
// group of each generation (group.cc), and the step (step.cc); the traffic
// with the shard servers is ShardTransport's. Thread-safety as Client's: one
// thread calls it; the membership thread only cancels calls in flight.
#ifndef STRATA_CLIENT_CLIENT_IMPL_H_
#define STRATA_CLIENT_CLIENT_IMPL_H_

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/buckets.h"
#include "client/collective.h"
#include "client/device.h"
#include "client/gradient_memory.h"
#include "client/gradient_stream.h"
#include "client/param_gatherer.h"
#include "client/param_stream.h"
#include "client/push_stream.h"
#include "client/shard_transport.h"
#include "client/worker_membership.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata {

// The deadline of the client's control calls (coordinator, bulk writes, reads).
inline constexpr absl::Duration kControlRpcTimeout = absl::Seconds(30);

// Errors after which a re-formed generation can complete the step.
inline bool IsRetryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsAborted(s) || absl::IsCancelled(s) ||
         absl::IsDeadlineExceeded(s);
}

class ClientImpl : public Client {
 public:
  // Channels to the coordinator and the servers are made with
  // `credentials`; the buffers live on `device` (options.device's).
  ClientImpl(ClientOptions options, FlatLayout layout, ChannelCredentials credentials,
             std::unique_ptr<Device> device);

  absl::Status Init();

  int rank() const override { return static_cast<int>(rank_); }
  int world_size() const override { return static_cast<int>(world_size_); }
  uint64_t generation() const override { return generation_.number(); }
  int num_servers() const override { return transport_.num_servers(); }
  const FlatLayout& layout() const override { return layout_; }
  int64_t step() const override { return step_; }
  float loss_scale() const override { return scaler_.scale(); }
  int loss_scale_good_steps() const override { return scaler_.good_steps(); }
  absl::Status RestoreLossScale(float scale, int good_steps) override {
    if (!(std::isfinite(scale) && scale > 0) || good_steps < 0) {
      return absl::InvalidArgumentError(absl::StrCat("loss scale ", scale, " with ", good_steps,
                                                     " good steps: the scale must be finite and "
                                                     "> 0, the steps >= 0"));
    }
    scaler_.Restore(scale, good_steps);
    scaler_known_ = true;
    return absl::OkStatus();
  }
  absl::Status SetLearningRate(float lr) override {
    if (!(std::isfinite(lr) && lr >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("learning rate ", lr, " must be finite and >= 0"));
    }
    lr_ = lr;
    return absl::OkStatus();
  }
  absl::Status SetGroupLearningRates(absl::Span<const float> lrs) override {
    const size_t groups = std::max<size_t>(options_.job.groups.size(), 1);
    if (lrs.size() != groups) {
      return absl::InvalidArgumentError(
          absl::StrCat(lrs.size(), " learning rates for ", groups, " parameter group(s)"));
    }
    for (float lr : lrs) {
      if (!(std::isfinite(lr) && lr >= 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("learning rate ", lr, " must be finite and >= 0"));
      }
    }
    group_lrs_.assign(lrs.begin(), lrs.end());
    return absl::OkStatus();
  }
  ReformStats last_reform() const override { return reform_stats_; }

  absl::Status CopyParams(absl::Span<float> out) const override {
    if (on_demand()) {
      return absl::FailedPreconditionError(
          "CopyParams with on-demand parameters: this worker holds only its slice; gather "
          "ranges with StartGather()");
    }
    if (out.size() != layout_.num_params()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyParams needs ", layout_.num_params(), " floats, got ", out.size()));
    }
    RETURN_IF_ERROR(CheckOnDevice(out, "CopyParams' floats"));
    if (param_stream_ != nullptr) RETURN_IF_ERROR(param_stream_->WaitAll());
    return device_->CastToFloat(options_.job.dtype, params_.data(), out.data(), out.size());
  }

  uint64_t resident_param_bytes() const override { return params_.size(); }
  uint64_t peak_grad_bytes() const override { return grads_.peak_bytes(); }
  std::unique_ptr<PendingGather> StartGather(FlatRange range, absl::Span<float> out) override;

  absl::Status AccumulateGradients(absl::Span<const float> grads) override {
    return Accumulate(grads, scaler_.scale());
  }
  absl::Status AccumulateScaledGradients(absl::Span<const float> scaled_grads) override {
    return Accumulate(scaled_grads, 1.0f);
  }

  absl::Status GradientsReady(FlatRange range, absl::Span<const float> grads) override {
    return StreamGradients(range, grads, scaler_.scale());
  }
  absl::Status ScaledGradientsReady(FlatRange range,
                                    absl::Span<const float> scaled_grads) override {
    return StreamGradients(range, scaled_grads, 1.0f);
  }

  absl::StatusOr<StepResult> Step() override;
  absl::StatusOr<StepResult> Step(const GradientFn& compute) override;
  void AnnounceLeave() override { leave_announced_ = true; }
  absl::Status Leave() override;

  absl::Status AllReduceSum(absl::Span<double> values) override {
    RETURN_IF_ERROR(DrainGathers());
    if (stream_ != nullptr) stream_->WaitIdle();
    return collective_->AllReduceSum(values);
  }

  absl::StatusOr<MasterState> ReadMasterState() const override {
    return transport_.ReadMasterState(kControlRpcTimeout);
  }

 private:
  bool on_demand() const { return options_.params == ParamResidency::kOnDemand; }
  // INVALID_ARGUMENT unless the caller's `floats` (`what`) are in the
  // device's memory, where the client reads and writes them.
  absl::Status CheckOnDevice(absl::Span<const float> floats, absl::string_view what) const {
    if (floats.empty() || device_->Holds(floats.data())) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(what, " are not in ", device_->name(), "'s memory (ClientOptions::device)"));
  }
  // Waits for the gathers started and the last step's all-gather; their
  // first error, which also marks the group broken when retryable (a lost
  // worker).
  absl::Status DrainGathers();
  // Waits for the last step's all-gather (ParamStream), if any, and ends it:
  // its error.
  absl::Status FinishParamStream();
  absl::Status CreateJob();
  // Adds `grads` * `multiplier` to the accumulator as one micro-batch.
  absl::Status Accumulate(absl::Span<const float> grads, float multiplier) {
    if (stream_ != nullptr) {
      return absl::FailedPreconditionError(
          "gradients accumulated after GradientsReady() in the same step: earlier micro-batches "
          "go first");
    }
    if (grads.size() != layout_.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradients have ", grads.size(), " elements; the model has ", layout_.num_params()));
    }
    RETURN_IF_ERROR(CheckOnDevice(grads, "gradients"));
    ASSIGN_OR_RETURN(uint8_t * whole, grads_.Whole());
    RETURN_IF_ERROR(device_->AccumulateScaled(options_.job.dtype, grads.data(), multiplier, whole,
                                              grads.size()));
    ++micro_batches_;
    return absl::OkStatus();
  }
  // GradientsReady(): starts the step's stream at its first range (after the
  // re-form where the last step agreed on one: the gathers started are drained
  // first).
  absl::Status StreamGradients(FlatRange range, absl::Span<const float> grads, float multiplier);
  // Ends the step's stream, if any, cancelling its pushes still open.
  void DropStream();
  // The try of the next step within this generation: 0, then one more after
  // each overflow (the servers replace an older try's staged pushes).
  uint32_t Attempt();
  // A streamed step's end once its scalars are known: commits them to every
  // server, then pulls; the pushes are done once the pulls are.
  absl::Status CommitAndPull(int64_t step, const PushScalars& push);
  // The lowest and highest step the job's chunks have applied; UNAVAILABLE
  // while chunks move, unless `while_moving` (the recorded placement's).
  absl::StatusOr<std::pair<int64_t, int64_t>> AppliedSteps(bool while_moving = false);
  // AppliedSteps(), asked again (after a backoff) while a chunk's server
  // cannot tell (it restarts: the chunk shows as missing or unreachable),
  // until `deadline` or a generation newer than the one forming.
  absl::StatusOr<std::pair<int64_t, int64_t>> AppliedStepsOnceKnown(absl::Time deadline);
  absl::Status WriteInitialParams();
  // Writes options_.initial.safetensors_path's state to the servers (a new job).
  absl::Status WriteInitialState();
  // Waits for a generation newer than `than` that includes this worker and
  // forms its group: rank, world size, slice, the step every chunk has
  // applied (rank 0's view, so all agree), its parameters and the loss scale.
  // A generation that breaks while the group forms (a member died, the
  // coordinator restarted: retryable errors) leads to the next one -- which
  // this worker asks the coordinator to open where no membership change
  // does -- until options_.rendezvous_timeout.
  absl::Status Reform(uint64_t than);
  // One try of Reform() from `started`: forms the group of the first
  // generation newer than `*than` (which it sets to that generation).
  absl::Status ReformOnce(uint64_t* than, absl::Time started, absl::Time deadline);
  // Cuts the buffers for the group just formed (rank_, world_size_): the
  // padded space, the parameters held, the buckets, the gradient memory
  // and the slice's pieces. Errors are the device's.
  absl::Status CutBuffers();
  // Cuts the slice into pieces at chunk and bucket boundaries (slice_pieces_)
  // under the transport's placement.
  void CutSlicePieces();
  // With the group just formed: the step every chunk has applied and the
  // loss scale, as rank 0 sees them (written first when the job is new);
  // the scaler takes the scale.
  absl::StatusOr<int64_t> AgreeOnStep(absl::Time deadline);
  // Waits (until `deadline`) for the coordinator's JobInfo with placement
  // `version` or newer and takes it.
  absl::Status FollowPlacement(uint64_t version, absl::Time deadline);
  // With the group's collective: where the newest generation the workers
  // agree on (generation_agreement.h) has this group's members and a newer
  // placement (it only moved chunks), and rank 0 finds every chunk at the
  // group's step (or, `in_step`, the next), takes its placement and runs on
  // in it without re-forming -- no new group, no parameters pulled, the
  // step not recomputed. False (all workers alike) where not: re-form.
  // Errors are the collective's.
  absl::StatusOr<bool> FollowInPlace(bool in_step);
  // At a step boundary, with no collective of its own: re-forms if the last
  // step failed, or if its closing all-reduce found a newer generation (all
  // the workers of the group decided together: it carried each one's view)
  // that the group cannot follow in place.
  absl::Status FollowGeneration();
  bool NewerGenerationHeard() const {
    return membership_->Latest().number() > generation_.number();
  }
  // After a retryable error: re-forms in the next generation, or returns
  // `error` when none forms in time.
  absl::Status Recover(const absl::Status& error);
  // Reduce-scatter, statistics, push and pull of the accumulated gradients,
  // divided by `divisor` (and the loss scale); see Step().
  absl::StatusOr<StepResult> RunStep(double divisor);
  // Pushes this worker's slice of the gradients for `step` with `push`'s
  // scalars (unless null) and pulls the slice's parameters after it,
  // concurrently, into params_.
  absl::Status PushPull(int64_t step, const PushScalars* push);
  // PushPull(step, &push) until it has succeeded on every worker of the
  // generation (one all-reduce tells): a shard server that fails or restarts
  // mid-step (UNAVAILABLE, DEADLINE_EXCEEDED) makes every worker push and
  // pull the step again -- chunks that applied it answer from the stored
  // result -- for up to step_timeout, and so does a generation that cut
  // the step (ABORTED) where the group follows it in place. Other errors
  // end the step everywhere.
  // A streamed step's first try is CommitAndPull().
  absl::Status PushPullEverywhere(int64_t step, const PushScalars& push, bool streamed);
  // Cancels the RPCs in flight of `generation` and, where a member of it is
  // missing, aborts its collective (the group's members all there, it
  // serves a generation that only moved the chunks: FollowInPlace()); from
  // the membership's watch thread, so it reads nothing of the step's but
  // collective_ under collective_mu_.
  void CancelInFlight(uint64_t generation, bool members_changed);
  // Replaces the collective (null: none) with that of `generation`; from the
  // step's thread.
  void SetCollective(std::unique_ptr<Collective> collective, uint64_t generation);

  const ClientOptions options_;
  const std::string worker_id_;
  const FlatLayout layout_;
  const size_t esize_;
  const ChannelCredentials credentials_;
  // transport_ and collective_ before membership_, whose thread cancels
  // their calls. collective_ is replaced by the step's thread only, under
  // collective_mu_, so that the watch thread may abort it; the step's thread
  // reads it without the lock.
  ShardTransport transport_;
  absl::Mutex collective_mu_;
  std::unique_ptr<Collective> collective_;
  uint64_t collective_generation_ = 0;  // the generation collective_ serves
  LossScaler scaler_;
  std::optional<float> lr_;       // SetLearningRate()'s; unset: the job's
  std::vector<float> group_lrs_;  // SetGroupLearningRates()'s; empty: lr_ for all
  bool scaler_known_ = false;     // it has run steps in some generation
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<WorkerMembership> membership_;
  v1::Generation generation_;
  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;
  uint64_t padded_num_params_ = 0;
  Buckets buckets_{0, 1};
  // The slice's pieces, cut at chunk and bucket boundaries (a streamed step
  // and its retries push the same pieces).
  std::vector<Piece> slice_pieces_;
  // The buffers' device; declared before the buffers, which it frees.
  const std::unique_ptr<Device> device_;
  // The parameters from flat index params_base_ on, on the device: all
  // (replicated) or the slice (on demand).
  DeviceMemory params_;
  uint64_t params_base_ = 0;
  // Where the slice's parameters are pulled to when the device is not the
  // host (pinned host memory), copied into params_ once pulled.
  DeviceMemory pulled_;
  GradientMemory grads_;
  int64_t step_ = 0;
  int micro_batches_ = 0;
  bool broken_ = false;  // the last step failed: re-form before the next
  // The last step's closing all-reduce found that a worker of the group
  // heard of a newer generation, or leaves: re-form before the next.
  bool reform_agreed_ = false;
  bool leave_announced_ = false;  // AnnounceLeave()
  ReformStats reform_stats_;
  uint32_t attempt_ = 0;  // Attempt()'s, for attempt_step_ in attempt_generation_
  int64_t attempt_step_ = -1;
  uint64_t attempt_generation_ = 0;
  // The streamed step in progress (GradientsReady()), and the retryable
  // error that ended it early (returned as a gather's would be).
  std::unique_ptr<PushStream> push_stream_;
  std::unique_ptr<GradientStream> stream_;
  absl::Status stream_failure_;
  bool computing_step_ = false;  // Step(GradientFn) is calling its GradientFn
  // The last step's all-gather (replicated), until the next use of the
  // collective, and its scratch.
  DeviceMemory param_stream_scratch_;
  std::unique_ptr<ParamStream> param_stream_;
  ParamGatherer gatherer_;
  // Declared last: destroyed first, finishing the gathers and the buckets'
  // work that read collective_, params_ and grads_.
  ThreadPool collective_thread_{1};
};

}  // namespace strata

#endif  // STRATA_CLIENT_CLIENT_IMPL_H_
