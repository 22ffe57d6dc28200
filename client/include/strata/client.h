// strata::Client: the library a training worker links. It registers the
// model with the coordinator (creating the job if it is new), joins it, forms
// the collective group with the other workers, and then runs one call per
// step: reduce-scatter of the gradients, global norm and overflow check,
// loss scaling and clipping, push to the shard servers, pull of the updated
// parameters of this worker's slice and all-gather of the whole model.
//
// Buffers: the client owns the flat low-precision parameters (replicated:
// every worker holds the whole model after each step) and the flat gradient
// accumulator, both in the job's dtype and laid out by FlatLayout.
//
// Not thread-safe: one thread drives a Client. Every worker of a job must
// call Step() (and AllReduceSum()) the same number of times in the same order.
#ifndef STRATA_CLIENT_H_
#define STRATA_CLIENT_H_

#include <cstdint>
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

struct ClientOptions {
  std::string coordinator_address = "127.0.0.1:7700";
  std::string job_id;
  // Unique per worker process; default: "<hostname>-<pid>".
  std::string worker_id;
  std::vector<TensorSpec> tensors;
  uint32_t world_size = 1;
  uint64_t chunk_num_params = uint64_t{4} << 20;
  AdamConfig adam;
  DType dtype = DType::kFp16;
  LossScaleOptions loss_scale;
  // Clip the global gradient norm to this value; 0 disables clipping.
  double max_grad_norm = 0.0;
  // "gloo" (CPU, TCP) or "nccl" (GPU).
  std::string collective = "gloo";
  // Address this worker's Gloo pairs listen on.
  std::string collective_hostname = "127.0.0.1";
  absl::Duration collective_timeout = absl::Seconds(60);
  // How long Connect() waits for the job's other workers.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // Deadline of one step's push and pull RPCs.
  absl::Duration step_timeout = absl::Seconds(120);
  // Initial FP32 weights over the flat space (FlatLayout::num_params()); used
  // by rank 0 when the job is new. Empty: zeros.
  std::vector<float> initial_params;
};

struct StepResult {
  int64_t step = 0;        // the step applied, or the last one when skipped
  bool skipped = false;    // overflow: no server saw this step
  double grad_norm = 0.0;  // of the averaged, unscaled gradient; Inf on overflow
  double clip_factor = 1.0;
  float loss_scale = 1.0f;  // the scale the step's gradients carried
  // Wall time of this step's collectives (reduce-scatter, norm all-reduce,
  // all-gather) and of its push and pull RPCs.
  double collective_seconds = 0.0;
  double push_pull_seconds = 0.0;
};

struct MasterState {
  int64_t step = 0;
  std::vector<float> params, exp_avg, exp_avg_sq;  // flat, FlatLayout::num_params()
};

class Client {
 public:
  // Creates or opens the job, joins it, waits for all its workers, forms the
  // collective group and pulls the current parameters. INVALID_ARGUMENT for a
  // bad spec; FAILED_PRECONDITION when the job exists with another spec or is
  // full; RESOURCE_EXHAUSTED when it does not fit; UNAVAILABLE or
  // DEADLINE_EXCEEDED when peers or servers cannot be reached.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  virtual ~Client() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Number of shard servers holding this job's chunks.
  virtual int num_servers() const = 0;
  virtual const FlatLayout& layout() const = 0;
  // The last step applied (0 before the first).
  virtual int64_t step() const = 0;
  virtual float loss_scale() const = 0;

  // The current low-precision parameters as FP32, flat (layout().num_params()).
  virtual absl::Status CopyParams(absl::Span<float> out) const = 0;
  // Adds one micro-batch's gradient (FP32, flat, unscaled) to the accumulator,
  // multiplied by the loss scale and rounded to the job's dtype.
  virtual absl::Status AccumulateGradients(absl::Span<const float> grads) = 0;
  // One optimizer step over the accumulated micro-batches (their mean), then
  // clears the accumulator. FAILED_PRECONDITION with nothing accumulated.
  virtual absl::StatusOr<StepResult> Step() = 0;
  // Sums `values` over the workers (for metrics such as the loss).
  virtual absl::Status AllReduceSum(absl::Span<double> values) = 0;
  // Reads the FP32 master state from the shard servers.
  virtual absl::StatusOr<MasterState> ReadMasterState() const = 0;
};

}  // namespace strata

#endif  // STRATA_CLIENT_H_
