#include "strata/client.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/collective.h"
#include "client/param_gatherer.h"
#include "client/shard_transport.h"
#include "client/worker_membership.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"
#include "kernels/grad_stats.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"
#include "rpc/rendezvous_keys.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {
namespace {

constexpr absl::Duration kControlRpcTimeout = absl::Seconds(30);
// Step(GradientFn) computes a step at most this often (overflows, lost workers).
constexpr int kMaxStepAttempts = 64;

// Errors after which a re-formed generation can complete the step.
bool IsRetryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsAborted(s) || absl::IsCancelled(s) ||
         absl::IsDeadlineExceeded(s);
}

std::string DefaultWorkerId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

v1::JobSpec SpecFromOptions(const ClientOptions& o) {
  v1::JobSpec spec;
  spec.set_job_id(o.job_id);
  for (const TensorSpec& t : o.tensors) {
    v1::TensorSpec* out = spec.add_tensors();
    out->set_name(t.name);
    for (int64_t d : t.shape) out->add_shape(d);
  }
  spec.set_world_size(o.world_size);
  spec.set_samples_per_step(o.samples_per_step);
  spec.set_chunk_num_params(o.chunk_num_params);
  *spec.mutable_adam() = AdamToProto(o.adam);
  spec.set_dtype(DTypeToProto(o.dtype));
  spec.set_checkpoint_every_steps(o.checkpoint_every_steps);
  spec.set_checkpoint_dir(o.checkpoint_dir);
  spec.set_checkpoint_keep_last(o.checkpoint_keep_last);
  return spec;
}

class ClientImpl : public Client {
 public:
  ClientImpl(ClientOptions options, FlatLayout layout)
      : options_(std::move(options)),
        worker_id_(options_.worker_id.empty() ? DefaultWorkerId() : options_.worker_id),
        layout_(std::move(layout)),
        esize_(DTypeSize(options_.dtype)),
        transport_(options_.job_id, &layout_, options_.dtype),
        scaler_(options_.loss_scale),
        coordinator_(v1::Coordinator::NewStub(MakeChannel(options_.coordinator_address))) {}

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
    CastToFloat(options_.dtype, params_.data(), out.data(), out.size());
    return absl::OkStatus();
  }

  uint64_t resident_param_bytes() const override { return params_.size(); }
  std::unique_ptr<PendingGather> StartGather(FlatRange range, absl::Span<float> out) override;

  absl::Status AccumulateGradients(absl::Span<const float> grads) override {
    return Accumulate(grads, scaler_.scale());
  }
  absl::Status AccumulateScaledGradients(absl::Span<const float> scaled_grads) override {
    return Accumulate(scaled_grads, 1.0f);
  }

  absl::StatusOr<StepResult> Step() override;
  absl::StatusOr<StepResult> Step(const GradientFn& compute) override;
  absl::Status Leave() override;

  absl::Status AllReduceSum(absl::Span<double> values) override {
    RETURN_IF_ERROR(DrainGathers());
    return collective_->AllReduceSum(values);
  }

  absl::StatusOr<MasterState> ReadMasterState() const override {
    return transport_.ReadMasterState(kControlRpcTimeout);
  }

 private:
  bool on_demand() const { return options_.params == ParamResidency::kOnDemand; }
  // Waits for the gathers started; their first error, which also marks the
  // group broken when retryable (a lost worker).
  absl::Status DrainGathers();
  absl::Status CreateJob();
  // Adds `grads` * `multiplier` to the accumulator as one micro-batch.
  absl::Status Accumulate(absl::Span<const float> grads, float multiplier) {
    if (grads.size() != layout_.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradients have ", grads.size(), " elements; the model has ", layout_.num_params()));
    }
    AccumulateScaled(options_.dtype, grads.data(), multiplier, grads_.data(), grads.size());
    ++micro_batches_;
    return absl::OkStatus();
  }
  // The lowest and highest step the job's chunks have applied.
  absl::StatusOr<std::pair<int64_t, int64_t>> AppliedSteps();
  absl::Status WriteInitialParams();
  // Writes options_.initial_state_path's state to the servers (a new job).
  absl::Status WriteInitialState();
  // Waits for a generation newer than `than` that includes this worker and
  // forms its group: rank, world size, slice, the step every chunk has
  // applied (rank 0's view, so all agree), its parameters and the loss scale.
  absl::Status Reform(uint64_t than);
  // The generation carries a newer placement: waits (until `deadline`) for
  // the coordinator's JobInfo with it and takes it.
  absl::Status FollowPlacement(absl::Time deadline);
  // At a step boundary: re-forms when any worker of the group has heard of a
  // newer generation (all of them decide together), until none has; first
  // re-forms if the last step failed.
  absl::Status FollowGeneration();
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
  // result -- for up to step_timeout. Other errors end the step everywhere.
  absl::Status PushPullEverywhere(int64_t step, const PushScalars& push);
  // Cancels the RPCs in flight (a worker of the generation was lost).
  void CancelInFlight();

  const ClientOptions options_;
  const std::string worker_id_;
  const FlatLayout layout_;
  const size_t esize_;
  LossScaler scaler_;
  std::optional<float> lr_;    // SetLearningRate()'s; unset: the job's
  bool scaler_known_ = false;  // it has run steps in some generation
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<WorkerMembership> membership_;
  v1::Generation generation_;
  uint32_t rank_ = 0;
  uint32_t world_size_ = 0;
  uint64_t padded_num_params_ = 0;
  ShardTransport transport_;
  std::vector<Piece> slice_pieces_;
  std::unique_ptr<Collective> collective_;
  // The parameters from flat index params_base_ on: all (replicated) or the slice (on demand).
  std::vector<uint8_t> params_;
  uint64_t params_base_ = 0;
  std::vector<uint8_t> grads_;
  int64_t step_ = 0;
  int micro_batches_ = 0;
  bool broken_ = false;
  ReformStats reform_stats_;  // the last step failed: re-form before the next
  // Declared last: destroyed first, finishing the gathers that read
  // collective_ and params_.
  ParamGatherer gatherer_;
};

absl::Status ClientImpl::CreateJob() {
  absl::Time deadline = absl::Now() + options_.rendezvous_timeout;
  v1::CreateJobRequest create;
  *create.mutable_spec() = SpecFromOptions(options_);
  create.set_restore_from(options_.restore_from);
  v1::JobInfo job;
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    job.Clear();
    absl::Status s = FromGrpcStatus(coordinator_->CreateJob(&context, create, &job));
    if (s.ok()) break;
    // UNAVAILABLE: another worker is creating the job right now.
    if (!absl::IsUnavailable(s) || absl::Now() > deadline) {
      return absl::Status(s.code(),
                          absl::StrCat("creating job '", options_.job_id, "' at coordinator ",
                                       options_.coordinator_address, ": ", s.message()));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return transport_.SetPlacement(std::move(job));
}

absl::StatusOr<std::pair<int64_t, int64_t>> ClientImpl::AppliedSteps() {
  v1::GetPlacementRequest request;
  request.set_job_id(options_.job_id);
  v1::GetPlacementResponse placement;
  RETURN_IF_ERROR(CallUnary(coordinator_.get(), &v1::Coordinator::Stub::GetPlacement, request,
                            &placement, kControlRpcTimeout));
  int64_t lowest = std::numeric_limits<int64_t>::max(), highest = 0;
  for (const v1::PlacementRow& row : placement.rows()) {
    if (row.applied_step() < 0) {
      return absl::UnavailableError(absl::StrCat("chunk ", row.chunk_id(), " on shard server ",
                                                 row.server_address(), " is ", row.tier()));
    }
    lowest = std::min(lowest, row.applied_step());
    highest = std::max(highest, row.applied_step());
  }
  if (placement.rows().empty()) lowest = 0;
  if (highest > lowest + 1) {
    return absl::InternalError(absl::StrCat("job '", options_.job_id, "' has chunks at step ",
                                            lowest, " and at step ", highest));
  }
  return std::make_pair(lowest, highest);
}

absl::Status ClientImpl::WriteInitialParams() {
  const std::vector<float>& p = options_.initial_params;
  return transport_.SendPieces(
      sizeof(float), &v1::ShardServer::Stub::WriteParams,
      [&](const Piece& piece, v1::WriteParamsRequest* request) {
        request->mutable_params()->Add(p.begin() + piece.begin, p.begin() + piece.begin + piece.n);
      },
      kControlRpcTimeout);
}

absl::Status ClientImpl::WriteInitialState() {
  const std::string& path = options_.initial_state_path;
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  const uint64_t n = layout_.num_params();
  std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  // Moments come for every tensor or for none.
  std::optional<bool> with_moments;
  for (size_t i = 0; i < options_.tensors.size(); ++i) {
    const TensorSpec& spec = options_.tensors[i];
    const FlatRange range = layout_.tensor_range(i);
    auto copy_tensor = [&](const std::string& name, std::vector<float>& to) -> absl::Status {
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, " has no tensor '", name, "'"));
      }
      if (it->second.shape != spec.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", name, "' of ", path, " has shape [", absl::StrJoin(it->second.shape, ","),
            "]; the model registers [", absl::StrJoin(spec.shape, ","), "]"));
      }
      std::copy(it->second.values.begin(), it->second.values.end(), to.begin() + range.begin);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(copy_tensor(spec.name, p));
    bool has = file.tensors.count(spec.name + ".exp_avg") > 0;
    if (with_moments.has_value() && *with_moments != has) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " has Adam moments for some tensors and not for '", spec.name, "'"));
    }
    with_moments = has;
    if (has) {
      RETURN_IF_ERROR(copy_tensor(spec.name + ".exp_avg", m));
      RETURN_IF_ERROR(copy_tensor(spec.name + ".exp_avg_sq", v));
    }
  }
  int64_t step = 0;
  if (with_moments.value_or(false) && !absl::SimpleAtoi(file.metadata["strata_step"], &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has Adam moments but no strata_step in its metadata"));
  }
  RETURN_IF_ERROR(transport_.SendPieces(
      3 * sizeof(float), &v1::ShardServer::Stub::WriteState,
      [&](const Piece& piece, v1::WriteStateRequest* request) {
        request->set_step(step);
        request->mutable_params()->Add(p.begin() + piece.begin, p.begin() + piece.begin + piece.n);
        request->mutable_exp_avg()->Add(m.begin() + piece.begin, m.begin() + piece.begin + piece.n);
        request->mutable_exp_avg_sq()->Add(v.begin() + piece.begin,
                                           v.begin() + piece.begin + piece.n);
      },
      kControlRpcTimeout));
  LogEventCat("client", "job ", options_.job_id, ": state of step ", step, " written from ", path);
  return absl::OkStatus();
}

absl::Status ClientImpl::Init() {
  RETURN_IF_ERROR(CreateJob());
  ASSIGN_OR_RETURN(membership_,
                   WorkerMembership::Join(options_.coordinator_address, options_.job_id, worker_id_,
                                          [this] { CancelInFlight(); }));
  return Reform(/*than=*/0);
}

absl::Status ClientImpl::Reform(uint64_t than) {
  const absl::Time started = absl::Now();
  const absl::Time deadline = started + options_.rendezvous_timeout;
  collective_.reset();
  while (true) {
    ASSIGN_OR_RETURN(v1::Generation generation, membership_->WaitNewer(than, deadline));
    const auto& ids = generation.worker_ids();
    CollectiveOptions collective;
    collective.coordinator_address = options_.coordinator_address;
    collective.key_prefix = GenerationRendezvousPrefix(options_.job_id, generation.number());
    collective.rank = static_cast<int>(std::find(ids.begin(), ids.end(), worker_id_) - ids.begin());
    collective.size = ids.size();
    collective.hostname = options_.collective_hostname;
    collective.timeout = options_.collective_timeout;
    // A member that never comes (lost before it formed) leads to the next one.
    collective.abandon = [this, number = generation.number()] {
      return membership_->Latest().number() > number;
    };
    absl::StatusOr<std::unique_ptr<Collective>> formed = options_.collective == "nccl"
                                                             ? CreateNcclCollective(collective)
                                                             : CreateGlooCollective(collective);
    if (!formed.ok()) {
      if (absl::Now() > deadline) return formed.status();
      than = generation.number();
      continue;
    }
    collective_ = *std::move(formed);
    generation_ = generation;
    rank_ = collective.rank;
    world_size_ = collective.size;
    break;
  }
  if (generation_.placement_version() != transport_.job().placement_version()) {
    RETURN_IF_ERROR(FollowPlacement(deadline));
  }
  // Accumulated gradients keep their flat positions in the new world's buffer.
  padded_num_params_ = layout_.PaddedNumParams(world_size_);
  const FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
  params_base_ = on_demand() ? slice.begin : 0;
  params_.resize((on_demand() ? slice.size() : padded_num_params_) * esize_, 0);
  grads_.resize(padded_num_params_ * esize_, 0);
  slice_pieces_ = transport_.PiecesOf(slice, kMaxPayloadBytes / esize_);

  // Rank 0 decides the step and the loss scale; the others take its view.
  // state = {step, step is fresh, loss scale, good steps, scaler known}
  double state[5] = {0, 0, 0, 0, 0};
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(auto steps, AppliedSteps());
    // A job restored from a checkpoint has its state already.
    const bool fresh = steps.second == 0 && transport_.job().restored_from().empty();
    if (fresh && !options_.initial_state_path.empty()) {
      RETURN_IF_ERROR(WriteInitialState());
      ASSIGN_OR_RETURN(steps, AppliedSteps());
    }
    state[0] = static_cast<double>(steps.first);
    state[1] = fresh ? 1 : 0;
  }
  if (scaler_known_) {
    state[2] = scaler_.scale();
    state[3] = scaler_.good_steps();
    state[4] = 1;
  }
  RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(state)));
  int64_t step = static_cast<int64_t>(state[0]);
  // Workers that ran steps agree on the scale (they saw the same overflows).
  if (state[4] > 0) scaler_.Restore(state[2] / state[4], static_cast<int>(state[3] / state[4]));
  // At the step of the checkpoint the job started or resumed from: its scaler.
  if (transport_.job().has_restored_loss_scale() && step == transport_.job().restored_step()) {
    scaler_.Restore(transport_.job().restored_loss_scale().scale(),
                    transport_.job().restored_loss_scale().good_steps());
  }
  scaler_known_ = true;
  if (state[1] > 0 && rank_ == 0 && !options_.initial_params.empty()) {
    RETURN_IF_ERROR(WriteInitialParams());
  }
  RETURN_IF_ERROR(collective_->Barrier());
  const absl::Time pull_started = absl::Now();
  RETURN_IF_ERROR(PushPull(step, /*push=*/nullptr));
  if (!on_demand()) {
    RETURN_IF_ERROR(collective_->AllGather(options_.dtype, params_.data(), padded_num_params_));
  }
  const absl::Time done = absl::Now();
  reform_stats_.count++;
  reform_stats_.generation = generation_.number();
  reform_stats_.seconds = absl::ToDoubleSeconds(done - started);
  reform_stats_.param_pull_seconds = absl::ToDoubleSeconds(done - pull_started);
  reform_stats_.steps_lost = std::max<int64_t>(step_ - step, 0);
  step_ = step;
  broken_ = false;
  membership_->Running(generation_, step_);
  return absl::OkStatus();
}

absl::Status ClientImpl::FollowPlacement(absl::Time deadline) {
  v1::GetJobRequest request;
  request.set_job_id(options_.job_id);
  // The coordinator announces a move before it has finished it.
  while (true) {
    v1::JobInfo job;
    RETURN_IF_ERROR(CallUnary(coordinator_.get(), &v1::Coordinator::Stub::GetJob, request, &job,
                              kControlRpcTimeout));
    if (job.placement_version() >= generation_.placement_version()) {
      RETURN_IF_ERROR(transport_.SetPlacement(std::move(job)));
      break;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("job '", options_.job_id, "': its chunks did not finish moving (placement ",
                       generation_.placement_version(), ") within the rendezvous timeout"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  LogEventCat("client", "job ", options_.job_id, ": chunks moved (placement ",
              transport_.job().placement_version(), "), resuming from checkpoint ",
              transport_.job().restored_from());
  return absl::OkStatus();
}

absl::Status ClientImpl::FollowGeneration() {
  if (broken_) RETURN_IF_ERROR(Recover(absl::UnavailableError("the last step failed")));
  // Every worker of a generation runs this check first, so a worker that
  // just re-formed (or joined) and one that has run steps in it agree.
  while (true) {
    double newer[1] = {membership_->Latest().number() > generation_.number() ? 1.0 : 0.0};
    absl::Status s = collective_->AllReduceSum(absl::MakeSpan(newer));
    if (!s.ok()) {
      RETURN_IF_ERROR(Recover(s));
    } else if (newer[0] > 0) {
      RETURN_IF_ERROR(Reform(generation_.number()));
    } else {
      return absl::OkStatus();
    }
  }
}

absl::Status ClientImpl::Recover(const absl::Status& error) {
  broken_ = true;
  absl::Status reformed = Reform(generation_.number());
  if (!reformed.ok()) {
    return absl::Status(reformed.code(),
                        absl::StrCat(reformed.message(), " (after: ", error.message(), ")"));
  }
  return reformed;
}

void ClientImpl::CancelInFlight() { transport_.CancelGeneration(generation_.number()); }

absl::Status ClientImpl::PushPull(int64_t step, const PushScalars* push) {
  StepTransfer transfer;
  transfer.step = step;
  transfer.generation = generation_.number();
  transfer.pieces = &slice_pieces_;
  transfer.push = push;
  transfer.grads = grads_.data();
  transfer.params = params_.data();
  transfer.params_base = params_base_;
  // At least two chunks and a piece, so that a chunk that waits for another
  // worker's pushes never stalls the rest.
  transfer.window_bytes = std::max(options_.max_step_bytes_in_flight,
                                   2 * options_.chunk_num_params * esize_ + kMaxPayloadBytes);
  transfer.timeout = options_.step_timeout;
  return transport_.PushPull(transfer);
}

absl::Status ClientImpl::PushPullEverywhere(int64_t step, const PushScalars& push) {
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    absl::Status s = PushPull(step, &push);
    // NOT_FOUND: the job is not on that server (now): its chunks are moving.
    bool retryable = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsNotFound(s);
    // {failed and retryable here, failed for good here}: every worker acts on the sums.
    double failed[2] = {!s.ok() && retryable ? 1.0 : 0.0, !s.ok() && !retryable ? 1.0 : 0.0};
    RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(failed)));
    if (failed[0] == 0 && failed[1] == 0) return absl::OkStatus();
    if (failed[1] > 0 || absl::Now() > deadline) {
      return s.ok() ? absl::AbortedError(absl::StrCat("step ", step, " failed at another worker"))
                    : s;
    }
    LogEventCat("client", "step ", step, ": ",
                s.ok() ? std::string("another worker's push or pull failed") : s.ToString(),
                "; pushing and pulling it again");
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<StepResult> ClientImpl::RunStep(double divisor) {
  const DType dtype = options_.dtype;
  StepResult result;
  result.generation = generation_.number();
  result.world_size = static_cast<int>(world_size_);
  absl::Time started = absl::Now();
  RETURN_IF_ERROR(collective_->ReduceScatterSum(dtype, grads_.data(), padded_num_params_));
  FlatRange slice = layout_.WorkerSlice(rank_, world_size_);
  GradStats stats = ComputeGradStats(dtype, grads_.data() + slice.begin * esize_, slice.size());
  double global[2] = {stats.sum_squares, stats.all_finite ? 0.0 : 1.0};
  RETURN_IF_ERROR(collective_->AllReduceSum(absl::MakeSpan(global)));
  result.collective_seconds = absl::ToDoubleSeconds(absl::Now() - started);

  result.loss_scale = scaler_.scale();
  divisor *= scaler_.scale();
  micro_batches_ = 0;
  if (global[1] > 0) {  // some worker saw Inf or NaN: skip, lower the scale
    std::fill(grads_.begin(), grads_.end(), 0);
    scaler_.Update(/*overflow=*/true);
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
  // The scaler after this step, kept with it by the chunks for checkpoints.
  LossScaler after = scaler_;
  after.Update(/*overflow=*/false);
  push.loss_scale_after.set_scale(after.scale());
  push.loss_scale_after.set_good_steps(after.good_steps());
  started = absl::Now();
  RETURN_IF_ERROR(PushPullEverywhere(step_ + 1, push));
  result.push_pull_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  std::fill(grads_.begin(), grads_.end(), 0);
  if (!on_demand()) {
    started = absl::Now();
    RETURN_IF_ERROR(collective_->AllGather(dtype, params_.data(), padded_num_params_));
    result.collective_seconds += absl::ToDoubleSeconds(absl::Now() - started);
  }
  scaler_.Update(/*overflow=*/false);
  result.step = ++step_;
  membership_->Running(generation_, step_);
  return result;
}

absl::Status ClientImpl::DrainGathers() {
  absl::Status s = gatherer_.Drain();
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
  } else if (!on_demand()) {
    CastToFloat(options_.dtype, params_.data() + range.begin * esize_, out.data(), out.size());
  } else {
    ParamGatherer::Source source;
    source.collective = collective_.get();
    source.layout = &layout_;
    source.dtype = options_.dtype;
    source.rank = rank_;
    source.world_size = world_size_;
    source.slice = layout_.WorkerSlice(rank_, world_size_);
    source.slice_bytes = params_.data();
    return gatherer_.Start(source, range, out);
  }
  return ParamGatherer::Done(refused);
}

absl::StatusOr<StepResult> ClientImpl::Step() {
  if (micro_batches_ == 0) {
    return absl::FailedPreconditionError("Step() with no accumulated gradients");
  }
  RETURN_IF_ERROR(DrainGathers());
  RETURN_IF_ERROR(FollowGeneration());
  absl::StatusOr<StepResult> result = RunStep(static_cast<double>(world_size_) * micro_batches_);
  if (!result.ok()) {
    broken_ = IsRetryable(result.status());
    std::fill(grads_.begin(), grads_.end(), 0);
    micro_batches_ = 0;
  }
  return result;
}

absl::StatusOr<StepResult> ClientImpl::Step(const GradientFn& compute) {
  const uint64_t batch = options_.samples_per_step;
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
    std::fill(grads_.begin(), grads_.end(), 0);
    micro_batches_ = 0;
    absl::Status computed;
    for (uint64_t b = begin; b < end && computed.ok(); b += micro) {
      computed = compute(MicroBatch{target, b, std::min(end, b + micro)}, *this);
    }
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

absl::Status ClientImpl::Leave() {
  RETURN_IF_ERROR(DrainGathers());
  ASSIGN_OR_RETURN(v1::Generation without_me, membership_->Leave());
  // The others are at (or coming to) their next step boundary: tell them in
  // its generation check, so that they re-form without this worker.
  double newer[1] = {1.0};
  absl::Status told = collective_->AllReduceSum(absl::MakeSpan(newer));
  collective_.reset();
  membership_.reset();
  return told;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (options.world_size < 1) return absl::InvalidArgumentError("world_size must be >= 1");
  if (options.collective != "gloo" && options.collective != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("collective '", options.collective, "' is not gloo or nccl"));
  }
  ASSIGN_OR_RETURN(FlatLayout layout,
                   FlatLayout::Create(options.tensors, options.chunk_num_params));
  if (!options.initial_params.empty() + !options.initial_state_path.empty() +
          !options.restore_from.empty() >
      1) {
    return absl::InvalidArgumentError(
        "give at most one of initial_params, initial_state_path and restore_from");
  }
  if (!options.initial_params.empty() && options.initial_params.size() != layout.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_params has ", options.initial_params.size(),
                     " values; the flat layout has ", layout.num_params()));
  }
  auto client = std::make_unique<ClientImpl>(std::move(options), std::move(layout));
  RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace strata
