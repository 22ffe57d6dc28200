#include "tools/bench/gpu_worker_bench.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device.h"
#include "core/status_macros.h"
#include "strata/client.h"
#include "testing/local_cluster.h"
#include "tools/bench/bench_util.h"

namespace strata {
namespace {

using nlohmann::json;

// Median seconds of one worker's step and of its parts.
struct StepSeconds {
  double step = 0;
  double collective = 0;  // StepResult::collective_seconds: reduce-scatter, statistics
  double push_pull = 0;   // StepResult::push_pull_seconds
};

// The median step of one worker on `device_name` ("cpu" with Gloo, or a GPU
// with NCCL) of a job of o.num_params parameters on `cluster`.
absl::StatusOr<StepSeconds> MedianStepSeconds(const LocalCluster& cluster,
                                              const GpuWorkerBenchOptions& o,
                                              const std::string& device_name) {
  ASSIGN_OR_RETURN(std::unique_ptr<Device> device, OpenDevice(device_name));
  const size_t bytes = o.num_params * sizeof(float);
  ASSIGN_OR_RETURN(DeviceMemory grads, device->Allocate(bytes));
  ASSIGN_OR_RETURN(DeviceMemory params, device->Allocate(bytes));
  {
    const std::vector<float> values(o.num_params, 1e-4f);
    RETURN_IF_ERROR(device->Copy(grads.data(), values.data(), bytes));
  }
  ClientOptions c;
  c.coordinator_address = cluster.coordinator_address();
  c.job_id = absl::StrCat("gpu-worker-", device->is_host() ? "host" : "device");
  c.job.tensors = {{"w", {static_cast<int64_t>(o.num_params)}}};
  c.job.dtype = o.dtype;
  c.device = device_name;
  c.collective = device->is_host() ? "gloo" : "nccl";
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(c));
  const absl::Span<float> grad_span(reinterpret_cast<float*>(grads.data()), o.num_params);
  const absl::Span<float> param_span(reinterpret_cast<float*>(params.data()), o.num_params);
  std::vector<double> seconds, collective, push_pull;
  for (int s = 0; s < o.steps + 2; ++s) {
    const absl::Time started = absl::Now();
    RETURN_IF_ERROR(client->AccumulateGradients(grad_span));
    ASSIGN_OR_RETURN(StepResult result, client->Step());
    RETURN_IF_ERROR(client->CopyParams(param_span));
    if (result.skipped)
      return absl::InternalError("a step overflowed: the gradients are too large");
    if (s < 2) continue;
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - started));
    collective.push_back(result.collective_seconds);
    push_pull.push_back(result.push_pull_seconds);
  }
  return StepSeconds{Median(seconds), Median(collective), Median(push_pull)};
}

json Parts(const StepSeconds& s) {
  return json{{"step_s", s.step}, {"collective_s", s.collective}, {"push_pull_s", s.push_pull}};
}

}  // namespace

absl::StatusOr<json> BenchGpuWorker(const GpuWorkerBenchOptions& o) {
  ASSIGN_OR_RETURN(const double fused_s, GpuFusedAdamSeconds(o.num_params, o.dtype));
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = o.servers;
  cluster_options.executor_threads = o.executor_threads;
  // p, m, v and the copy per parameter, twice over for two jobs, and slack.
  cluster_options.host_budget_bytes = 2 * o.num_params * 16 / o.servers + (uint64_t{256} << 20);
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(cluster_options));
  ASSIGN_OR_RETURN(const StepSeconds device, MedianStepSeconds(*cluster, o, "cuda:0"));
  ASSIGN_OR_RETURN(const StepSeconds host, MedianStepSeconds(*cluster, o, "cpu"));
  return json{{"bench", "gpu-worker"},
              {"params", o.num_params},
              {"dtype", DTypeName(o.dtype)},
              {"servers", o.servers},
              {"executor_threads", o.executor_threads},
              {"device", Parts(device)},
              {"host", Parts(host)},
              {"fused_adamw_on_gpu_s", fused_s},
              {"device_speedup_vs_host", host.step / device.step},
              {"fraction_of_fused_adamw", fused_s / device.step}};
}

}  // namespace strata
