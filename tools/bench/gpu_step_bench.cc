#include "tools/bench/gpu_step_bench.h"

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "storage/gpu_tier.h"
#include "tools/bench/server_step_rig.h"

namespace strata {
namespace {

using nlohmann::json;

// The bus between host and `gpu`, both ways at once (as a step's gradients
// go in while other chunks' copies come out): bytes per second to and from
// the GPU, each way over kCopiers threads (one copy engine does not fill the
// bus) that each make `reps` copies of 64 MiB from and to pinned memory.
absl::StatusOr<std::pair<double, double>> BusBytesPerSecond(Tier& gpu, int reps) {
  constexpr int kCopiers = 4;
  constexpr uint64_t kBytes = uint64_t{64} << 20;
  HostTier pinned(2 * kCopiers * kBytes, HostTier::Pinning::kGpu);
  std::vector<std::byte*> buffers;
  std::vector<Extent> extents;
  absl::Cleanup free = [&] {
    for (const Extent& e : extents) gpu.Free(e);
  };
  for (int i = 0; i < 2 * kCopiers; ++i) {
    absl::StatusOr<Extent> host = pinned.Allocate(kBytes);
    if (!host.ok()) return host.status();
    buffers.push_back(pinned.Map(*host));
    absl::StatusOr<Extent> device = gpu.Allocate(kBytes);
    if (!device.ok()) return device.status();
    extents.push_back(*device);
  }
  // Copier i < kCopiers writes to the GPU, the others read from it.
  std::vector<absl::Status> statuses(2 * kCopiers);
  auto copy = [&](int i, int times) {
    for (int r = 0; r < times && statuses[i].ok(); ++r) {
      statuses[i] = i < kCopiers ? WriteAndWait(gpu, extents[i], 0, {buffers[i], kBytes})
                                 : ReadAndWait(gpu, extents[i], 0, {buffers[i], kBytes});
    }
  };
  for (int i = 0; i < 2 * kCopiers; ++i) copy(i, 1);  // warm-up
  std::vector<double> seconds(2);
  std::vector<std::thread> ways;
  for (int way = 0; way < 2; ++way) {
    ways.emplace_back([&, way] {
      absl::Time started = absl::Now();
      std::vector<std::thread> copiers;
      for (int i = way * kCopiers; i < (way + 1) * kCopiers; ++i)
        copiers.emplace_back(copy, i, reps);
      for (std::thread& t : copiers) t.join();
      seconds[way] = absl::ToDoubleSeconds(absl::Now() - started);
    });
  }
  for (std::thread& t : ways) t.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  const double bytes = double{kCopiers} * reps * kBytes;
  return std::make_pair(bytes / seconds[0], bytes / seconds[1]);
}

}  // namespace

absl::StatusOr<json> BenchGpuStep(const KernelBenchOptions& o) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  absl::StatusOr<StatePrecision> precision = StatePrecisionOf(o);
  if (!precision.ok()) return precision.status();
  absl::StatusOr<std::unique_ptr<Tier>> gpu = OpenGpuTier(0, 0);
  if (!gpu.ok()) return gpu.status();
  absl::StatusOr<std::unique_ptr<ServerStepRig>> rig =
      ServerStepRig::Create(o, gpu->get(), *precision);
  if (!rig.ok()) return rig.status();
  // The bound: each parameter's gradient in and copy out, both ways at once.
  absl::StatusOr<std::pair<double, double>> bus = BusBytesPerSecond(**gpu, o.reps);
  if (!bus.ok()) return bus.status();
  absl::StatusOr<double> step_s = (*rig)->MedianStepSeconds();
  if (!step_s.ok()) return step_s.status();
  rig->reset();
  absl::StatusOr<std::unique_ptr<ServerStepRig>> host_rig =
      ServerStepRig::Create(o, nullptr, *precision);
  if (!host_rig.ok()) return host_rig.status();
  absl::StatusOr<double> host_step_s = (*host_rig)->MedianStepSeconds();
  if (!host_step_s.ok()) return host_step_s.status();
  const double params_per_s = o.num_params / *step_s;
  const double bound = std::min(bus->first, bus->second) / DTypeSize(o.grad_dtype);
  return json{{"bench", "gpu-step"},
              {"params", o.num_params},
              {"threads", o.threads},
              {"dtype", DTypeName(o.grad_dtype)},
              {"state", o.state},
              {"params_per_s", params_per_s},
              {"to_gpu_GBps", bus->first / 1e9},
              {"from_gpu_GBps", bus->second / 1e9},
              {"bound_params_per_s", bound},
              {"fraction_of_bound", params_per_s / bound},
              {"host_tier_params_per_s", o.num_params / *host_step_s},
              {"speedup_vs_host_tier", *host_step_s / *step_s}};
}

}  // namespace strata
