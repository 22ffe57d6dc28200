#include "tools/bench/nvme_step_bench.h"

#include <filesystem>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "storage/nvme_tier.h"
#include "tools/bench/fio.h"
#include "tools/bench/server_step_rig.h"

namespace strata {
namespace {

using nlohmann::json;

// The median step over `host_params` parameters of host-tier chunks, alone
// and while `nvme_rig` steps without pause on threads of its own.
absl::StatusOr<json> HostStepBesideNvme(const KernelBenchOptions& o, uint64_t host_params,
                                        ServerStepRig& nvme_rig) {
  KernelBenchOptions host_options = o;
  host_options.num_params = host_params;
  absl::StatusOr<std::unique_ptr<ServerStepRig>> rig = ServerStepRig::Create(host_options, nullptr);
  if (!rig.ok()) return rig.status();
  absl::StatusOr<double> alone_s = (*rig)->MedianStepSeconds();
  if (!alone_s.ok()) return alone_s.status();
  absl::Notification stop;
  absl::Status nvme_status;
  int nvme_steps = 0;
  std::thread nvme_steps_thread([&] {
    while (!stop.HasBeenNotified() && nvme_status.ok()) {
      nvme_status = nvme_rig.Step().status();
      ++nvme_steps;
    }
  });
  absl::StatusOr<double> beside_s = (*rig)->MedianStepSeconds();
  stop.Notify();
  nvme_steps_thread.join();
  if (!beside_s.ok()) return beside_s.status();
  if (!nvme_status.ok()) return nvme_status;
  return json{{"host_params", host_params},
              {"host_step_s", *alone_s},
              {"host_step_beside_nvme_s", *beside_s},
              {"host_slowdown", *beside_s / *alone_s},
              {"nvme_steps_meanwhile", nvme_steps}};
}

}  // namespace

absl::StatusOr<json> BenchNvmeStep(const KernelBenchOptions& o, const NvmeBenchOptions& nvme) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  if (nvme.dir.empty()) return absl::InvalidArgumentError("nvme-step needs --dir");
  const uint64_t state_bytes = o.num_params * 12;
  double fio_read = 0, fio_write = 0, params_per_s = 0;
  json host_figures = json::object();  // stays empty without --host_params
  {
    absl::StatusOr<std::unique_ptr<NvmeTier>> tier = NvmeTier::Open(NvmeTierOptions{
        nvme.dir, 2 * state_bytes + (uint64_t{64} << 20), nvme.queue_depth, nvme.io_bytes});
    if (!tier.ok()) return tier.status();
    absl::StatusOr<std::unique_ptr<ServerStepRig>> rig = ServerStepRig::Create(o, tier->get());
    if (!rig.ok()) return rig.status();
    absl::StatusOr<double> step_s = (*rig)->MedianStepSeconds();
    if (!step_s.ok()) return step_s.status();
    params_per_s = o.num_params / *step_s;
    if (nvme.host_params > 0) {
      absl::StatusOr<json> figures = HostStepBesideNvme(o, nvme.host_params, **rig);
      if (!figures.ok()) return figures.status();
      host_figures = *std::move(figures);
    }
  }
  std::error_code ignored;
  std::filesystem::remove(nvme.dir + "/strata-nvme.data", ignored);
  // fio writes its file first, then reads it back.
  absl::StatusOr<double> w = Fio(nvme.dir, "write", nvme.io_bytes, nvme.queue_depth);
  if (!w.ok()) return w.status();
  absl::StatusOr<double> r = Fio(nvme.dir, "read", nvme.io_bytes, nvme.queue_depth);
  std::filesystem::remove(nvme.dir + "/strata-fio.data", ignored);
  if (!r.ok()) return r.status();
  fio_read = *r;
  fio_write = *w;
  double bound = 1.0 / (12.0 / (fio_read * 1e9) + 12.0 / (fio_write * 1e9));
  json result{{"bench", "nvme-step"},
              {"params", o.num_params},
              {"threads", o.threads},
              {"queue_depth", nvme.queue_depth},
              {"io_bytes", nvme.io_bytes},
              {"params_per_s", params_per_s},
              {"read_GBps", params_per_s * 12 / 1e9},
              {"write_GBps", params_per_s * 12 / 1e9},
              {"fio_read_GBps", fio_read},
              {"fio_write_GBps", fio_write},
              {"bound_params_per_s", bound},
              {"fraction_of_bound", params_per_s / bound}};
  result.update(host_figures);
  return result;
}

}  // namespace strata
