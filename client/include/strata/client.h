// strata::Client: the library a training worker links. It registers the
// model with the coordinator (creating the job if it is new), joins it, forms
// the collective group with the other workers of the job's generation, and
// then runs one call per step: reduce-scatter of the gradients, global norm
// and overflow check, loss scaling and clipping, push to the shard servers,
// pull of the updated parameters of this worker's slice and all-gather of the
// whole model.
//
// Elastic jobs: workers may join and leave a running job. At each step
// boundary the client switches to the job's newest generation (re-forming the
// group, taking its new rank and slice, pulling the parameters). With
// Step(GradientFn) the client also hands out the step's samples and survives
// a lost worker: it re-forms and recomputes the interrupted step, so the
// trainer sees one call per step and never restarts.
//
// Buffers: the client owns the flat low-precision parameters (replicated:
// every worker holds the whole model after each step; on demand: only its
// slice, and the trainer gathers the ranges it is about to use) and the
// flat gradient accumulator (on demand: its slice and the buckets of a
// streamed step in flight), both in the job's dtype, laid out by FlatLayout
// and kept on ClientOptions::device (host memory, or a GPU's).
//
// Not thread-safe: one thread drives a Client (on-demand gathers run on the
// client's own thread). Every worker of a job must call Step(),
// AllReduceSum() and StartGather() the same number of times in the same order.
#ifndef STRATA_CLIENT_H_
#define STRATA_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "strata/flat_layout.h"
#include "strata/loss_scaler.h"
#include "strata/types.h"

namespace strata {

// Where a worker keeps the low-precision parameters between steps. Every
// worker of a job must use the same.
enum class ParamResidency {
  // The whole model on every worker (ZeRO-2 style): one all-gather per step.
  kReplicated,
  // Only the worker's slice (ZeRO-3 style): the trainer gathers each range
  // (a layer's tensors) just before it uses it, with StartGather().
  kOnDemand,
};

// A gather started by Client::StartGather(). Wait() blocks until it is done
// and returns its status; destroying it waits too. One thread uses it.
class PendingGather {
 public:
  virtual ~PendingGather() = default;
  virtual absl::Status Wait() = 0;
};

// What a job is: its model, batch, sharding, optimizer and checkpoint
// settings, everything the coordinator records as the job's spec
// (v1::JobSpec, converted in one place). The first worker
// creates the job with them; every later worker's must be equal, else
// joining fails with FAILED_PRECONDITION.
struct JobOptions {
  std::vector<TensorSpec> tensors;
  // Workers the job starts with: the first step waits for them.
  uint32_t world_size = 1;
  // Global batch of Step(GradientFn): step t consumes global sample indices
  // [(t-1) * samples_per_step, t * samples_per_step), split among the
  // workers of its generation. 0: Step() only.
  uint64_t samples_per_step = 0;
  uint64_t chunk_num_params = uint64_t{4} << 20;
  // Copies of each chunk on distinct shard servers (1 to 3): with 2 or more,
  // a shard server lost for good costs no step -- its chunks go on from
  // their other copies -- and each push goes to every copy. Connect() fails
  // with FAILED_PRECONDITION when fewer servers are live.
  uint32_t replicas = 1;
  AdamConfig adam;
  // Parameter groups (torch's param_groups), which TensorSpec::group indexes:
  // each its own weight decay (in place of adam.weight_decay) and, with
  // SetGroupLearningRates(), its own learning rate. Empty: one group.
  std::vector<ParamGroup> groups;
  DType dtype = DType::kFp16;
  // How the shard servers store Adam's m and v: FP32, or 8-bit codes with
  // an FP32 scale per block of 256 parameters (6 bytes per parameter instead
  // of 12: about twice the parameters in the same budgets), in host memory
  // or on NVMe (not in a GPU tier). Copies and moves of its chunks keep the
  // 8-bit bits.
  StatePrecision state_precision = StatePrecision::kFp32;
  // Save a checkpoint every this many steps (0: only when asked, `stratactl
  // checkpoint save`), into checkpoint_dir (an absolute path the servers and
  // coordinator share; empty: the coordinator's --checkpoint_dir), keeping
  // the newest checkpoint_keep_last (0: all).
  uint64_t checkpoint_every_steps = 0;
  std::string checkpoint_dir;
  uint32_t checkpoint_keep_last = 0;
};

// Where a new job's state comes from: at most one is set (Connect() fails
// with INVALID_ARGUMENT naming them otherwise); none: zeros. Each is used by
// rank 0 only, and only when the job is new.
struct InitialState {
  // FP32 weights over the flat space (FlatLayout::num_params()).
  std::vector<float> params;
  // A safetensors file that `stratactl export` wrote: each tensor by its name
  // and shape; with the Adam moments (NAME.exp_avg, NAME.exp_avg_sq) the job
  // starts at the exported step and continues exactly as the exported job
  // would have. Connect() fails with INVALID_ARGUMENT naming a missing or
  // mismatched tensor, or the file's error.
  std::string safetensors_path;
  // A checkpoint directory (DIR/JOB/step-N, from `stratactl checkpoint
  // list`), restored on the servers (p, m, v and the step; a job whose
  // state precision is not the checkpoint's loads them converted): the model must be the
  // checkpoint's; the servers, the world size and the chunk size may differ. FAILED_PRECONDITION
  // for another model, DATA_LOSS naming a missing, truncated or corrupted file.
  std::string checkpoint;
};

// One worker's settings: which job (and, when it is new, what it is and
// where it starts from), and how this worker reaches the cluster, computes
// and waits.
struct ClientOptions {
  std::string coordinator_address = "127.0.0.1:7700";
  // TLS to the coordinator and the shard servers: the CA their certificates
  // chain to (setting it turns TLS on), and optionally a certificate and key
  // to present. All empty: plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // Where the cluster authenticates callers (strata-coordinator --auth_file):
  // a file holding a user's token (the user creates the job and owns it) or
  // the job's worker token (JobInfo.worker_token, which a launcher hands to
  // its workers). Needs TLS. Either way the shard servers see the job's
  // worker token, which the coordinator returns. Empty: no token.
  std::string token_file;
  std::string job_id;
  JobOptions job;
  InitialState initial;
  // Unique per worker process; default: "<hostname>-<pid>".
  std::string worker_id;
  // Samples per call of the GradientFn; 0: this worker's whole share at once.
  uint64_t micro_batch_samples = 0;
  // Every worker of a job must use the same residency, loss scaling and
  // clipping.
  ParamResidency params = ParamResidency::kReplicated;
  LossScaleOptions loss_scale;
  // Clip the global gradient norm to this value; 0 disables clipping.
  double max_grad_norm = 0.0;
  // "gloo" (CPU, TCP) or "nccl" (GPU). With Gloo the process ignores
  // SIGPIPE unless it handles it itself: a peer that dies while this worker
  // writes to it is then an error of the step, not the end of this worker.
  std::string collective = "gloo";
  // Where the flat parameter and gradient buffers live: "cpu" (host memory),
  // or "cuda" / "cuda:N" (that GPU's memory; needs collective "nccl", which
  // then reduces and gathers in place, and only this worker's slice crosses
  // to pinned host memory for the shard servers). With a GPU, every float
  // span given to or filled by the client (gradients, CopyParams,
  // StartGather) is that GPU's memory, complete before the call (computed on
  // the legacy default stream, or the trainer's stream synchronized).
  std::string device = "cpu";
  // Address this worker's Gloo pairs listen on.
  std::string collective_hostname = "127.0.0.1";
  absl::Duration collective_timeout = absl::Seconds(60);
  // How long Connect() waits for the job's other workers, and a lost
  // worker's peers wait for the next generation.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Deadline of one step's push and pull RPCs.
  absl::Duration step_timeout = absl::Seconds(120);
  // Bytes of a step's gradients this worker keeps in flight to the shard
  // servers, and as many bytes of parameters pulled (raised to two chunks
  // and a piece when less): a server holds at most that much of each
  // worker's step in memory besides its budget. A push is answered once its
  // chunk is applied, so a window much smaller than a step also paces the
  // pushes by the applies.
  uint64_t max_step_bytes_in_flight = uint64_t{128} << 20;
  // The streamed step's buckets (GradientsReady()): contiguous ranges of the
  // flat space of this many parameters, each reduce-scattered and pushed as
  // soon as it and the buckets after it are complete.
  uint64_t bucket_num_params = uint64_t{1} << 20;
};

// A micro-batch of Step(GradientFn): global sample indices
// [sample_begin, sample_end) of `step`.
struct MicroBatch {
  int64_t step = 0;
  uint64_t sample_begin = 0;
  uint64_t sample_end = 0;
};

struct StepResult {
  int64_t step = 0;        // the step applied, or the last one when skipped
  bool skipped = false;    // overflow: no server saw this step
  double grad_norm = 0.0;  // of the averaged, unscaled gradient; Inf on overflow
  double clip_factor = 1.0;
  float loss_scale = 1.0f;  // the scale the step's gradients carried
  // Wall time of this step's collectives (reduce-scatter, norm all-reduce;
  // on demand nothing else: replicated, the all-gather runs after Step()
  // returns) and of its push and pull RPCs.
  double collective_seconds = 0.0;
  double push_pull_seconds = 0.0;
  // The generation that completed the step and its world size.
  uint64_t generation = 0;
  int world_size = 0;
  // Step(GradientFn): the global samples the step consumed, and how many
  // times it was computed (1, more after a lost worker or an overflow).
  uint64_t sample_begin = 0;
  uint64_t sample_end = 0;
  int attempts = 1;
};

// How a client last formed its group (at Connect() or a generation change).
struct ReformStats {
  int count = 0;                    // group formations so far
  uint64_t generation = 0;          // of the last one
  double seconds = 0.0;             // waiting for the generation, rendezvous and pull
  double param_pull_seconds = 0.0;  // pulling the parameters and all-gathering them
  // Completed steps undone by it: the job's chunks moved off a lost shard
  // server and it resumed from an older checkpoint (0 otherwise).
  int64_t steps_lost = 0;
};

struct MasterState {
  int64_t step = 0;
  std::vector<float> params, exp_avg, exp_avg_sq;  // flat, FlatLayout::num_params()
};

class Client;
// Computes the gradient of the SUM of the losses of `batch`'s samples at the
// parameters CopyParams() returns, and adds it with AccumulateGradients().
using GradientFn = std::function<absl::Status(const MicroBatch& batch, Client& client)>;

class Client {
 public:
  // Creates or opens the job, joins it, waits for a generation that includes
  // this worker, forms the collective group and pulls the current
  // parameters. INVALID_ARGUMENT for a bad spec; FAILED_PRECONDITION when the
  // job exists with another spec; RESOURCE_EXHAUSTED when it does not fit;
  // UNAVAILABLE or DEADLINE_EXCEEDED when peers or servers cannot be reached.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  virtual ~Client() = default;

  // In the current generation.
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual uint64_t generation() const = 0;
  // Number of shard servers holding this job's chunks.
  virtual int num_servers() const = 0;
  virtual const FlatLayout& layout() const = 0;
  // The last step applied (0 before the first).
  virtual int64_t step() const = 0;
  virtual float loss_scale() const = 0;
  // Good steps in a row since the dynamic loss scale last changed.
  virtual int loss_scale_good_steps() const = 0;
  // Sets the loss scaler's state (a trainer restoring its saved state);
  // INVALID_ARGUMENT unless scale is finite and > 0 and good_steps >= 0.
  virtual absl::Status RestoreLossScale(float scale, int good_steps) = 0;
  virtual ReformStats last_reform() const = 0;
  // The learning rate of the following steps (a schedule's value),
  // overriding the job's AdamConfig.lr. Every worker must set the same
  // before a step: the servers refuse a step whose pushes disagree.
  // INVALID_ARGUMENT unless finite and >= 0.
  virtual absl::Status SetLearningRate(float lr) = 0;
  // The learning rate of each parameter group (JobOptions::groups) for
  // the next steps, in place of SetLearningRate()'s. INVALID_ARGUMENT for
  // another number of rates than groups, or one that is not finite and >= 0.
  virtual absl::Status SetGroupLearningRates(absl::Span<const float> lrs) = 0;

  // The current low-precision parameters as FP32, flat (layout().num_params()),
  // once the last step's all-gather is done. FAILED_PRECONDITION with
  // on-demand parameters (use StartGather()); a lost worker's retryable
  // error as StartGather's.
  virtual absl::Status CopyParams(absl::Span<float> out) const = 0;
  // Bytes of low-precision parameters the client holds between steps: the
  // whole model (replicated) or this worker's slice (on demand).
  virtual uint64_t resident_param_bytes() const = 0;
  // The most bytes of gradients the client held at once since Connect():
  // replicated, the model's (one buffer that every step reuses). On demand
  // the gradients are sharded too: a streamed step holds this worker's
  // slice and the buckets in flight (at most 4 when GradientsReady() gets
  // the ranges in backward's reverse flat order), and the whole model's
  // only while micro-batches are accumulated with AccumulateGradients().
  virtual uint64_t peak_grad_bytes() const = 0;
  // Starts gathering `range` of the current parameters as FP32 into `out`
  // (range.size() floats, valid until Wait() returns). On demand, a
  // collective over the workers' slices that every worker of the generation
  // starts with the same ranges in the same order; it runs on the client's
  // gather thread, in the order started, while the caller computes. The next
  // Step(), AllReduceSum() or Leave() first waits for the gathers started.
  // Replicated: a local copy, done on return, once the last step's
  // all-gather -- which runs bucket by bucket in flat order on the client's
  // thread after Step() returns -- has reached the range's end, so the
  // next forward waits only for the layers it is about to run.
  // INVALID_ARGUMENT for a range
  // outside the flat space or an `out` of another size; UNAVAILABLE when a
  // worker is lost (the next Step() re-forms the group).
  virtual std::unique_ptr<PendingGather> StartGather(FlatRange range, absl::Span<float> out) = 0;
  absl::Status GatherParams(FlatRange range, absl::Span<float> out) {
    return StartGather(range, out)->Wait();
  }
  // Adds one micro-batch's gradient (FP32, flat, unscaled) to the accumulator,
  // multiplied by the loss scale and rounded to the job's dtype.
  virtual absl::Status AccumulateGradients(absl::Span<const float> grads) = 0;
  // The same for a gradient already multiplied by loss_scale() (the
  // backward pass of the scaled loss): rounded to the job's dtype as is.
  virtual absl::Status AccumulateScaledGradients(absl::Span<const float> scaled_grads) = 0;
  // The streamed step: adds the last micro-batch's gradient of `range`
  // (range.size() FP32 values, unscaled like AccumulateGradients') while
  // backward goes on (earlier micro-batches go through AccumulateGradients).
  // Buckets of the flat space (bucket_num_params) go in reverse order, each
  // once it and the buckets after it are complete: reduce-scattered over the
  // workers and this worker's part pushed to the shard servers, on the
  // client's collective thread, while the caller computes. The next Step()
  // finishes the step (buckets not complete go then): one all-reduce of the
  // norm, one small commit per server, pulls. The same master weights, bit
  // for bit, as AccumulateGradients() of the whole gradient. On demand it
  // waits while more than two buckets wait for the collective thread, so
  // that the gradients stay sharded (peak_grad_bytes()). Every worker
  // calls it and StartGather() in the same order. INVALID_ARGUMENT for a
  // range outside the flat space, a span of another size or a range that
  // overlaps one given for this step; a lost worker's retryable error as
  // StartGather's (the next Step() re-forms).
  virtual absl::Status GradientsReady(FlatRange range, absl::Span<const float> grads) = 0;
  // The same for a gradient already multiplied by loss_scale().
  virtual absl::Status ScaledGradientsReady(FlatRange range,
                                            absl::Span<const float> scaled_grads) = 0;
  // One optimizer step over the accumulated micro-batches (their mean), then
  // clears the accumulator. FAILED_PRECONDITION with nothing accumulated.
  // A lost worker ends the step with a retryable error (UNAVAILABLE,
  // ABORTED or CANCELLED) and drops the accumulated gradients; the next call
  // re-forms first. Step(GradientFn) recovers by itself. When the job's
  // chunks moved off a lost shard server, the job resumes from their
  // checkpoint's step: step() goes back to it (last_reform().steps_lost)
  // and the next step is the one after it.
  virtual absl::StatusOr<StepResult> Step() = 0;
  // One step of a job with samples_per_step > 0: calls `compute` for each
  // micro-batch of this worker's share of the step's samples, then steps
  // over their sum divided by samples_per_step. On overflow it lowers the
  // loss scale and computes the same samples again. If a worker is lost
  // mid-step, it waits for the next generation, re-forms and completes the
  // step (calling `compute` again, for its new share) -- or finds it
  // completed. When the job resumes from an older checkpoint (its chunks
  // moved off a lost shard server) it computes the step after that one
  // instead, and returns its result. FAILED_PRECONDITION without samples_per_step; compute's own
  // error; DEADLINE_EXCEEDED when no generation re-forms within
  // rendezvous_timeout.
  virtual absl::StatusOr<StepResult> Step(const GradientFn& compute) = 0;
  // This worker leaves after its next completed step: that step's closing
  // all-reduce tells the others, which re-form without it once it has
  // called Leave() (their next step starts in the new generation). Call
  // Leave() right after that step: the others wait for it.
  virtual void AnnounceLeave() = 0;
  // Leaves the job at a step boundary: the others go on without this worker
  // from their next step -- announced (AnnounceLeave()), before they
  // start it; else the coordinator's new generation cuts that step short,
  // as for a lost worker (Step(GradientFn) computes it again). Afterwards
  // only the destructor may be called. An all-gather of the last step's
  // parameters that a member leaving first cut short does not keep it.
  virtual absl::Status Leave() = 0;
  // Sums `values` over the workers (for metrics such as the loss).
  virtual absl::Status AllReduceSum(absl::Span<double> values) = 0;
  // Reads the FP32 master state from the shard servers.
  virtual absl::StatusOr<MasterState> ReadMasterState() const = 0;
};

}  // namespace strata

#endif  // STRATA_CLIENT_H_
