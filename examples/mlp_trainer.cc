// mlp_trainer: an example trainer that links strata::Client. It trains a
// two-layer MLP student to imitate a fixed random teacher MLP on generated
// inputs (a teacher-student task), with FP16 (or BF16) forward and backward,
// one process per worker, on the CPU or on a GPU (gpu_mlp.h: the client's
// buffers then live on the GPU too, reduced with NCCL). Rank 0 prints the
// loss of every step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/command_line.h"
#include "examples/gpu_mlp.h"
#include "kernels/half.h"
#include "strata/client.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7700", "host:port of strata-coordinator");
ABSL_FLAG(std::string, job, "mlp-demo", "job id");
ABSL_FLAG(std::string, worker_id, "", "unique worker id (default: hostname-pid)");
ABSL_FLAG(std::string, collective_host, "127.0.0.1",
          "the address (or host name) this worker's collectives listen on and announce to "
          "the other workers: this host's cluster address when they run on other hosts");
ABSL_FLAG(int, workers, 2, "number of workers (processes) in the job");
ABSL_FLAG(int, steps, 100, "optimizer steps to run");
ABSL_FLAG(int, step_delay_ms, 0,
          "pause after each step (to watch a run, or restart a server under it)");
ABSL_FLAG(int, batch, 64, "global batch size (split among workers)");
ABSL_FLAG(int, accumulation, 1, "micro-batches accumulated per step");
ABSL_FLAG(int, input_dim, 32, "input features");
ABSL_FLAG(int, hidden_dim, 128, "hidden units");
ABSL_FLAG(int, output_dim, 8, "outputs");
ABSL_FLAG(double, lr, 3e-3, "AdamW learning rate");
ABSL_FLAG(double, weight_decay, 0.0, "AdamW weight decay");
ABSL_FLAG(double, max_grad_norm, 1.0, "clip the global gradient norm (0: off)");
ABSL_FLAG(std::string, dtype, "fp16", "fp16 or bf16");
ABSL_FLAG(std::string, device, "auto",
          "where forward and backward run: cpu; cuda or cuda:N (GPU N, default 0: 16-bit cuBLAS "
          "products, the client's buffers on that GPU, NCCL among the workers, one GPU each); "
          "auto: cuda:0 where a GPU is found, else cpu");
ABSL_FLAG(uint64_t, chunk_params, 4096, "chunk size in parameters (multiple of 64)");
ABSL_FLAG(uint32_t, replicas, 1,
          "copies of each chunk on distinct shard servers (1-3): with 2, a lost server costs "
          "no step");
ABSL_FLAG(std::string, state_precision, "fp32",
          "how the shard servers store Adam's moments: fp32, or int8 (8-bit codes with a scale "
          "per 256 parameters: half the state's bytes)");
ABSL_FLAG(bool, stream, true,
          "hand the last micro-batch's gradients over tensor by tensor, last layer first "
          "(Client::GradientsReady, the streamed step); false: AccumulateGradients");
ABSL_FLAG(std::string, tls_ca, "",
          "the CA certificate (PEM) of a cluster that uses TLS; empty: plaintext");
ABSL_FLAG(std::string, tls_cert, "", "this trainer's certificate (PEM), where the cluster asks");
ABSL_FLAG(std::string, tls_key, "", "its private key (PEM)");
ABSL_FLAG(std::string, token_file, "",
          "a file holding your token, where the cluster authenticates callers (needs --tls_ca)");
ABSL_FLAG(std::string, summary_file, "",
          "rank 0 writes the JSON summary line to this file instead of stdout");

namespace {

using strata::FlatLayout;
using Dims = strata::examples::MlpDims;
using strata::examples::GpuMlp;

// Rounds to the compute dtype: the forward and backward run on 16-bit values.
float Round(float x, strata::DType dtype) {
  return dtype == strata::DType::kBf16 ? strata::Bf16ToFloat(strata::FloatToBf16(x))
                                       : strata::HalfToFloat(strata::FloatToHalf(x));
}

struct Mlp {
  const float *w1, *b1, *w2, *b2;  // [in x hidden], [hidden], [hidden x out], [out]
};

Mlp View(const std::vector<float>& flat, const FlatLayout& layout) {
  return Mlp{&flat[layout.tensor_range(0).begin], &flat[layout.tensor_range(1).begin],
             &flat[layout.tensor_range(2).begin], &flat[layout.tensor_range(3).begin]};
}

// Deterministic input of global sample `index`.
std::vector<float> Sample(uint64_t index, int dim, strata::DType dtype) {
  std::mt19937_64 rng(index * 0x9E3779B97F4A7C15ull + 1);
  std::normal_distribution<float> normal;
  std::vector<float> x(dim);
  for (float& v : x) v = Round(normal(rng), dtype);
  return x;
}

void Forward(const Mlp& m, const Dims& d, const std::vector<float>& x, strata::DType dtype,
             std::vector<float>* h, std::vector<float>* y) {
  h->assign(d.hidden, 0.0f);
  for (int j = 0; j < d.hidden; ++j) {
    float acc = m.b1[j];
    for (int i = 0; i < d.in; ++i) acc += x[i] * m.w1[i * d.hidden + j];
    (*h)[j] = Round(std::max(acc, 0.0f), dtype);
  }
  y->assign(d.out, 0.0f);
  for (int k = 0; k < d.out; ++k) {
    float acc = m.b2[k];
    for (int j = 0; j < d.hidden; ++j) acc += (*h)[j] * m.w2[j * d.out + k];
    (*y)[k] = Round(acc, dtype);
  }
}

// The student's gradient of sample `x` (its loss against the teacher's
// output, averaged over the outputs and the worker's `per_worker`
// samples), added to `grads`; returns the sample's loss.
double AddSampleGradient(const Mlp& m, const Mlp& teacher, const Dims& d,
                         const std::vector<float>& x, strata::DType dtype, int per_worker,
                         const FlatLayout& layout, std::vector<float>* grads) {
  std::vector<float> h, y, teacher_h, target;
  Forward(teacher, d, x, dtype, &teacher_h, &target);
  Forward(m, d, x, dtype, &h, &y);
  float* gw1 = &(*grads)[layout.tensor_range(0).begin];
  float* gb1 = &(*grads)[layout.tensor_range(1).begin];
  float* gw2 = &(*grads)[layout.tensor_range(2).begin];
  float* gb2 = &(*grads)[layout.tensor_range(3).begin];
  double loss = 0;
  std::vector<float> dh(d.hidden, 0.0f);
  for (int k = 0; k < d.out; ++k) {
    float err = y[k] - target[k];
    loss += 0.5 * err * err / d.out;
    float dy = err / d.out / per_worker;
    gb2[k] += dy;
    for (int j = 0; j < d.hidden; ++j) {
      gw2[j * d.out + k] += h[j] * dy;
      dh[j] += m.w2[j * d.out + k] * dy;
    }
  }
  for (int j = 0; j < d.hidden; ++j) {
    if (h[j] <= 0) continue;
    gb1[j] += dh[j];
    for (int i = 0; i < d.in; ++i) gw1[i * d.hidden + j] += x[i] * dh[j];
  }
  return loss;
}

// A random MLP of `layout`: normal weights scaled by `scale_w1` and
// `scale_w2`, zero biases.
std::vector<float> RandomMlp(const FlatLayout& layout, uint32_t seed, float scale_w1,
                             float scale_w2) {
  std::vector<float> flat(layout.num_params(), 0.0f);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (uint64_t i = layout.tensor_range(0).begin; i < layout.tensor_range(0).end; ++i) {
    flat[i] = scale_w1 * normal(rng);
  }
  for (uint64_t i = layout.tensor_range(2).begin; i < layout.tensor_range(2).end; ++i) {
    flat[i] = scale_w2 * normal(rng);
  }
  return flat;
}

// The job the flags describe, an MLP of `d` in `dtype`.
strata::ClientOptions OptionsFromFlags(const Dims& d, strata::DType dtype) {
  strata::ClientOptions options;
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.job_id = absl::GetFlag(FLAGS_job);
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.collective_hostname = absl::GetFlag(FLAGS_collective_host);
  options.job.world_size = absl::GetFlag(FLAGS_workers);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.job.tensors = {{"fc1.weight", {d.in, d.hidden}},
                         {"fc1.bias", {d.hidden}},
                         {"fc2.weight", {d.hidden, d.out}},
                         {"fc2.bias", {d.out}}};
  options.job.chunk_num_params = absl::GetFlag(FLAGS_chunk_params);
  options.job.replicas = absl::GetFlag(FLAGS_replicas);
  options.job.adam.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  options.job.adam.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  options.job.dtype = dtype;
  options.job.state_precision = absl::GetFlag(FLAGS_state_precision) == "int8"
                                    ? strata::StatePrecision::kInt8
                                    : strata::StatePrecision::kFp32;
  options.loss_scale.dynamic = dtype == strata::DType::kFp16;
  options.loss_scale.initial_scale = dtype == strata::DType::kFp16 ? 65536.0f : 1.0f;
  options.loss_scale.growth_interval = 50;
  options.max_grad_norm = absl::GetFlag(FLAGS_max_grad_norm);
  return options;
}

// Hands one micro-batch's gradients to the client: the last one of a step
// tensor by tensor, last layer first, when --stream (this trainer's
// per-sample backward completes every tensor at once; one that runs layer
// by layer would hand each over as it completes).
absl::Status HandOver(strata::Client& c, const FlatLayout& layout, absl::Span<const float> grads,
                      bool last_micro_batch) {
  if (!absl::GetFlag(FLAGS_stream) || !last_micro_batch) return c.AccumulateGradients(grads);
  for (size_t t = layout.tensors().size(); t-- > 0;) {
    const strata::FlatRange r = layout.tensor_range(t);
    absl::Status handed = c.GradientsReady(r, grads.subspan(r.begin, r.size()));
    if (!handed.ok()) return handed;
  }
  return absl::OkStatus();
}

// How a step's samples are cut: `batch` samples a step, in `accumulation`
// micro-batches of `per_worker` samples on each worker.
struct Batching {
  int batch;
  int accumulation;
  int per_worker;
};

// The forward and backward of one micro-batch: samples [first, first +
// count) of the global sample space; the gradient (divided by count) goes
// into `grads`, the samples' summed loss is returned.
using MicroBatchFn = std::function<absl::StatusOr<double>(uint64_t first, int count)>;

// The CPU's MicroBatchFn over the student `params` (host memory), one
// sample at a time.
MicroBatchFn CpuMicroBatch(const std::vector<float>& params, const Mlp& teacher, const Dims& d,
                           strata::DType dtype, const FlatLayout& layout,
                           std::vector<float>* grads) {
  return [&params, teacher, d, dtype, &layout, grads](uint64_t first,
                                                      int count) -> absl::StatusOr<double> {
    std::fill(grads->begin(), grads->end(), 0.0f);
    double loss = 0;
    for (int i = 0; i < count; ++i) {
      loss += AddSampleGradient(View(params, layout), teacher, d, Sample(first + i, d.in, dtype),
                                dtype, count, layout, grads);
    }
    return loss;
  };
}

// Runs the micro-batches of the client's current step on this worker's
// samples, handing their gradients (`grads`, which `micro_batch` fills)
// over; the mean loss of its samples.
absl::StatusOr<double> RunMicroBatches(strata::Client& c, const MicroBatchFn& micro_batch,
                                       absl::Span<const float> grads, const FlatLayout& layout,
                                       const Batching& b) {
  double loss_sum = 0;
  for (int micro = 0; micro < b.accumulation; ++micro) {
    const uint64_t first = (static_cast<uint64_t>(c.step()) * b.accumulation + micro) * b.batch +
                           c.rank() * b.per_worker;
    absl::StatusOr<double> loss = micro_batch(first, b.per_worker);
    if (!loss.ok()) return loss.status();
    loss_sum += *loss;
    absl::Status handed = HandOver(c, layout, grads, micro + 1 == b.accumulation);
    if (!handed.ok()) return handed;
  }
  return loss_sum / b.per_worker / b.accumulation;
}

// The model on a GPU where --device asks for one (auto: where one is
// found); null for the CPU. Exits where --device=cuda finds none.
std::unique_ptr<GpuMlp> GpuModel(const Dims& d, strata::DType dtype, const FlatLayout& layout,
                                 const std::vector<float>& teacher, int* ordinal) {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return nullptr;
  *ordinal = 0;
  if (device != "auto" && device != "cuda" &&
      !(absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), ordinal) &&
        *ordinal >= 0)) {
    std::fprintf(stderr, "mlp_trainer: --device must be cpu, cuda, cuda:N or auto, not %s\n",
                 device.c_str());
    std::exit(2);
  }
  const int max_samples =
      std::max(absl::GetFlag(FLAGS_batch) / absl::GetFlag(FLAGS_accumulation), 1);
  absl::StatusOr<std::unique_ptr<GpuMlp>> gpu =
      GpuMlp::Create(*ordinal, d, dtype, layout, teacher, max_samples);
  if (gpu.ok()) return *std::move(gpu);
  if (device != "auto") {
    std::fprintf(stderr, "mlp_trainer: --device=%s: %s\n", device.c_str(),
                 gpu.status().ToString().c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "mlp_trainer: no GPU (%s): forward and backward on the CPU\n",
               std::string(gpu.status().message()).c_str());
  return nullptr;
}

// What a run reports: each step's time and the first and last losses.
struct Figures {
  std::vector<double> step_ms;
  double loss_first = 0;
  double loss_last = 0;
};

// Trains `steps` steps: each pulls the parameters into `params`, runs this
// worker's micro-batches, averages the loss over the workers and steps;
// rank 0 prints each step. The first error, saying which part failed.
absl::Status Train(strata::Client& c, int steps, const MicroBatchFn& micro_batch,
                   absl::Span<float> params, absl::Span<const float> grads,
                   const FlatLayout& layout, const Batching& batching, Figures* figures) {
  // `status` with the part that failed before its message.
  auto failed = [](absl::string_view part, const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(part, ": ", status.message()));
  };
  for (int s = 0; s < steps; ++s) {
    const auto started = std::chrono::steady_clock::now();
    if (absl::Status copied = c.CopyParams(params); !copied.ok()) {
      return failed("parameters", copied);
    }
    absl::StatusOr<double> mean_loss = RunMicroBatches(c, micro_batch, grads, layout, batching);
    if (!mean_loss.ok()) return failed("gradients", mean_loss.status());
    double loss = *mean_loss;
    if (absl::Status reduced = c.AllReduceSum(absl::MakeSpan(&loss, 1)); !reduced.ok()) {
      return failed("loss all-reduce", reduced);
    }
    loss /= c.world_size();
    auto result = c.Step();
    if (!result.ok()) return failed("step failed", result.status());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    figures->step_ms.push_back(ms);
    if (s == 0) figures->loss_first = loss;
    figures->loss_last = loss;
    if (c.rank() == 0) {
      std::printf("step %4lld  loss %.6f  grad_norm %.4f  loss_scale %g%s  %.1f ms\n",
                  static_cast<long long>(result->step), loss, result->grad_norm, result->loss_scale,
                  result->skipped ? "  (skipped: overflow)" : "", ms);
      std::fflush(stdout);
    }
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_step_delay_ms)));
  }
  return absl::OkStatus();
}

// Rank 0's JSON summary line, to --summary_file or stdout.
void WriteSummary(int workers, int servers, int steps, double loss_first, double loss_last,
                  std::vector<double> step_ms) {
  std::sort(step_ms.begin(), step_ms.end());
  std::string summary = absl::StrFormat(
      "{\"workers\":%d,\"servers\":%d,\"steps\":%d,\"loss_first\":%.6f,\"loss_last\":%.6f,"
      "\"step_ms_median\":%.3f}",
      workers, servers, steps, loss_first, loss_last,
      step_ms.empty() ? 0.0 : step_ms[step_ms.size() / 2]);
  if (absl::GetFlag(FLAGS_summary_file).empty()) {
    std::printf("%s\n", summary.c_str());
  } else {
    std::ofstream(absl::GetFlag(FLAGS_summary_file)) << summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  strata::InitCommandLine(
      argc, argv,
      "mlp_trainer: trains a two-layer MLP student against a random teacher MLP\n"
      "through a strata cluster (FP16/BF16 forward and backward, AdamW on the shard\n"
      "servers). Start one process per worker:\n\n"
      "  mlp_trainer --coordinator=HOST:PORT --job=NAME --workers=2 --steps=100");
  const Dims d{absl::GetFlag(FLAGS_input_dim), absl::GetFlag(FLAGS_hidden_dim),
               absl::GetFlag(FLAGS_output_dim)};
  const std::string dtype_name = absl::GetFlag(FLAGS_dtype);
  if (dtype_name != "fp16" && dtype_name != "bf16") {
    std::fprintf(stderr, "mlp_trainer: --dtype must be fp16 or bf16, not %s\n", dtype_name.c_str());
    return 2;
  }
  const std::string state_name = absl::GetFlag(FLAGS_state_precision);
  if (state_name != "fp32" && state_name != "int8") {
    std::fprintf(stderr, "mlp_trainer: --state_precision must be fp32 or int8, not %s\n",
                 state_name.c_str());
    return 2;
  }
  const strata::DType dtype = dtype_name == "bf16" ? strata::DType::kBf16 : strata::DType::kFp16;
  strata::ClientOptions options = OptionsFromFlags(d, dtype);
  auto layout = FlatLayout::Create(options.job.tensors, options.job.chunk_num_params);
  if (!layout.ok()) {
    std::fprintf(stderr, "mlp_trainer: %s\n", layout.status().ToString().c_str());
    return 2;
  }
  // Student: He-style initialization; teacher: a fixed random MLP.
  options.initial.params =
      RandomMlp(*layout, 1, std::sqrt(2.0f / d.in), std::sqrt(1.0f / d.hidden));
  const std::vector<float> teacher_flat =
      RandomMlp(*layout, 7, std::sqrt(2.0f / d.in), std::sqrt(2.0f / d.hidden));
  const Mlp teacher = View(teacher_flat, *layout);
  int ordinal = -1;
  const std::unique_ptr<GpuMlp> gpu = GpuModel(d, dtype, *layout, teacher_flat, &ordinal);
  if (gpu != nullptr) {
    options.device = absl::StrCat("cuda:", ordinal);
    options.collective = "nccl";
  }

  auto client = strata::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "mlp_trainer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  strata::Client& c = **client;
  const int rank = c.rank();
  const int workers = c.world_size();
  Batching batching{absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_accumulation), 0};
  batching.per_worker = batching.batch / workers / batching.accumulation;
  if (batching.per_worker < 1) {
    std::fprintf(stderr, "mlp_trainer: --batch %d is too small for %d workers x %d micro-batches\n",
                 batching.batch, workers, batching.accumulation);
    return 2;
  }

  std::vector<float> host_params(layout->num_params()), host_grads(layout->num_params());
  const absl::Span<float> params = gpu ? gpu->params() : absl::MakeSpan(host_params);
  const absl::Span<float> grads = gpu ? gpu->grads() : absl::MakeSpan(host_grads);
  const MicroBatchFn micro_batch =
      gpu ? [&gpu](uint64_t first, int count) { return gpu->MicroBatch(first, count, count); }
          : CpuMicroBatch(host_params, teacher, d, dtype, *layout, &host_grads);
  const int steps = absl::GetFlag(FLAGS_steps);
  Figures figures;
  if (absl::Status trained =
          Train(c, steps, micro_batch, params, grads, *layout, batching, &figures);
      !trained.ok()) {
    std::fprintf(stderr, "mlp_trainer: %s\n", trained.ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    WriteSummary(workers, c.num_servers(), steps, figures.loss_first, figures.loss_last,
                 figures.step_ms);
  }
  return 0;
}
