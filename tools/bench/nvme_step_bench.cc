#include "tools/bench/nvme_step_bench.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "core/status_macros.h"
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

// The tier's file for states of `precision`: a slot per chunk, the spare
// slots commits write (one per thread and one, and one of the shorter last
// chunk's size), and room to spare.
uint64_t TierFileBytes(const KernelBenchOptions& o, StatePrecision precision) {
  const uint64_t chunk_params = std::min<uint64_t>(o.num_params, kBenchChunkElements);
  return StateBytes(o.num_params, precision) +
         (o.threads + 2) * StateBytes(chunk_params, precision) + (uint64_t{64} << 20);
}

// fio's file at most: its 4 s write run must cover the file, or the reads
// after it find extents never written, which the file system answers with
// zeros without reading the disk.
constexpr uint64_t kMaxFioFileBytes = uint64_t{2} << 30;

// A step rig over states of one precision in a tier file of its own in
// `dir` (made if missing), the file removed when the rig goes.
class NvmeRig {
 public:
  static absl::StatusOr<std::unique_ptr<NvmeRig>> Open(const KernelBenchOptions& o,
                                                       const NvmeBenchOptions& nvme,
                                                       std::string dir, StatePrecision precision,
                                                       uint64_t file_bytes) {
    std::unique_ptr<NvmeRig> rig(new NvmeRig(std::move(dir)));
    const NvmeTierOptions tier{rig->dir_, file_bytes, nvme.queue_depth, nvme.io_bytes};
    ASSIGN_OR_RETURN(rig->tier_, NvmeTier::Open(tier));
    ASSIGN_OR_RETURN(rig->steps_, ServerStepRig::Create(o, rig->tier_.get(), precision));
    return rig;
  }
  ~NvmeRig() {
    steps_.reset();
    tier_.reset();
    std::error_code ignored;
    std::filesystem::remove(dir_ + "/strata-nvme.data", ignored);
  }

  ServerStepRig& steps() { return *steps_; }

  // The bytes one step reads from the tier and writes to it (its counters).
  absl::StatusOr<std::pair<double, double>> StepBytes() {
    const uint64_t read_before = tier_->read_bytes(), written_before = tier_->written_bytes();
    RETURN_IF_ERROR(steps_->Step().status());
    return std::make_pair(static_cast<double>(tier_->read_bytes() - read_before),
                          static_cast<double>(tier_->written_bytes() - written_before));
  }

 private:
  explicit NvmeRig(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  std::unique_ptr<NvmeTier> tier_;
  std::unique_ptr<ServerStepRig> steps_;  // after the tier: its chunks go first
};

// The rig's steps over NVMe-resident states.
struct NvmeSteps {
  double step_seconds = 0;
  double read_bytes_per_step = 0, written_bytes_per_step = 0;
  uint64_t host_budget_bytes = 0;      // the rig's host tier
  json host_figures = json::object();  // stays empty without --host_params
};

// The median step of `rig`, with the bytes one step moves; with
// nvme.host_params, the host-tier step beside it too.
absl::StatusOr<NvmeSteps> StepOnNvme(const KernelBenchOptions& host_options,
                                     const NvmeBenchOptions& nvme, NvmeRig& rig) {
  NvmeSteps steps;
  ASSIGN_OR_RETURN(steps.step_seconds, rig.steps().MedianStepSeconds());
  steps.host_budget_bytes = rig.steps().host_budget_bytes();
  ASSIGN_OR_RETURN(const auto bytes, rig.StepBytes());
  steps.read_bytes_per_step = bytes.first;
  steps.written_bytes_per_step = bytes.second;
  if (nvme.host_params > 0) {
    ASSIGN_OR_RETURN(steps.host_figures,
                     HostStepBesideNvme(host_options, nvme.host_params, rig.steps()));
  }
  return steps;
}

// 8-bit states' step against FP32 states' on the same disk, in alternating
// steps (one of each after a warm-up of each, `reps` times), so that both
// of a pair meet the disk at the same moment.
struct PairedSpeedup {
  double speedup = 0;            // the median of the pairs' FP32 step over the 8-bit step
  double fp32_step_seconds = 0;  // the median of the FP32 steps
};
absl::StatusOr<PairedSpeedup> AlternateWithFp32(const KernelBenchOptions& o, NvmeRig& int8_rig,
                                                NvmeRig& fp32_rig) {
  RETURN_IF_ERROR(int8_rig.steps().Step().status());
  RETURN_IF_ERROR(fp32_rig.steps().Step().status());
  std::vector<double> speedups, fp32_seconds;
  for (int r = 0; r < o.reps; ++r) {
    ASSIGN_OR_RETURN(const double int8_s, int8_rig.steps().Step());
    ASSIGN_OR_RETURN(const double fp32_s, fp32_rig.steps().Step());
    speedups.push_back(fp32_s / int8_s);
    fp32_seconds.push_back(fp32_s);
  }
  return PairedSpeedup{Median(speedups), Median(fp32_seconds)};
}

// fio's rates on the tier's directory, in GB/s: writing its file, reading
// it, and both at once.
struct DiskRates {
  double write_GBps = 0;
  double read_GBps = 0;
  FioMixed mixed;
};

// One fio run of each kind on a file of `file_bytes`, removed afterwards;
// the first error.
absl::StatusOr<DiskRates> MeasureDisk(const NvmeBenchOptions& nvme, uint64_t file_bytes) {
  absl::Cleanup remove_file = [&nvme] { RemoveFioFiles(nvme.dir); };
  DiskRates rates;
  ASSIGN_OR_RETURN(rates.write_GBps,
                   Fio(nvme.dir, "write", file_bytes, nvme.io_bytes, nvme.queue_depth));
  ASSIGN_OR_RETURN(rates.read_GBps,
                   Fio(nvme.dir, "read", file_bytes, nvme.io_bytes, nvme.queue_depth));
  ASSIGN_OR_RETURN(rates.mixed,
                   FioReadWrite(nvme.dir, file_bytes, nvme.io_bytes, nvme.queue_depth));
  return rates;
}

// Each of `a`'s and `b`'s rates, the better one (the mixed run's by its sum).
DiskRates Better(const DiskRates& a, const DiskRates& b) {
  DiskRates better;
  better.write_GBps = std::max(a.write_GBps, b.write_GBps);
  better.read_GBps = std::max(a.read_GBps, b.read_GBps);
  better.mixed = a.mixed.read_GBps + a.mixed.write_GBps >= b.mixed.read_GBps + b.mixed.write_GBps
                     ? a.mixed
                     : b.mixed;
  return better;
}

}  // namespace

absl::StatusOr<json> BenchNvmeStep(const KernelBenchOptions& options,
                                   const NvmeBenchOptions& nvme) {
  if (absl::Status s = CheckDtype(options); !s.ok()) return s;
  if (nvme.dir.empty()) return absl::InvalidArgumentError("nvme-step needs --dir");
  if (nvme.executor_threads < 1) {
    return absl::InvalidArgumentError("nvme-step needs --nvme_executor_threads of at least 1");
  }
  absl::StatusOr<StatePrecision> precision = StatePrecisionOf(options);
  if (!precision.ok()) return precision.status();
  // The NVMe rigs' steps run on the NVMe executor's threads; the host-tier
  // step beside them on `options.threads`.
  KernelBenchOptions o = options;
  o.threads = nvme.executor_threads;
  const uint64_t file_bytes = TierFileBytes(o, *precision);
  // fio writes its file first, reads it, then reads and writes it at once,
  // before the steps and after them: the better run is the disk's (a cloud
  // disk's rate varies from second to second).
  std::error_code ignored;
  std::filesystem::create_directories(nvme.dir, ignored);  // the tier would, after fio
  const uint64_t fio_bytes = std::min(file_bytes, kMaxFioFileBytes);
  absl::StatusOr<DiskRates> disk = MeasureDisk(nvme, fio_bytes);
  if (!disk.ok()) return disk.status();
  absl::StatusOr<std::unique_ptr<NvmeRig>> rig =
      NvmeRig::Open(o, nvme, nvme.dir, *precision, file_bytes);
  if (!rig.ok()) return rig.status();
  absl::StatusOr<NvmeSteps> steps = StepOnNvme(options, nvme, **rig);
  if (!steps.ok()) return steps.status();
  // The process's memory against what the steps' own host tier may hold,
  // before another rig joins it.
  const uint64_t peak_rss_bytes = PeakRssBytes();
  // 8-bit states: the FP32 states' step too, in steps alternating with
  // theirs, where the disk has room for their file beside.
  absl::StatusOr<PairedSpeedup> speedup = absl::NotFoundError("not run");
  std::string fp32_skipped;
  if (*precision != StatePrecision::kFp32) {
    const uint64_t fp32_file_bytes = TierFileBytes(o, StatePrecision::kFp32);
    std::error_code error;
    const std::filesystem::space_info space = std::filesystem::space(nvme.dir, error);
    if (!error && space.available < fp32_file_bytes) {
      fp32_skipped = absl::StrCat("FP32 states need a ", fp32_file_bytes, "-byte file; ", nvme.dir,
                                  " has ", space.available, " bytes free");
    } else {
      const std::string fp32_dir = nvme.dir + "/fp32-states";
      {
        absl::StatusOr<std::unique_ptr<NvmeRig>> fp32_rig =
            NvmeRig::Open(o, nvme, fp32_dir, StatePrecision::kFp32, fp32_file_bytes);
        speedup = fp32_rig.ok() ? AlternateWithFp32(o, **rig, **fp32_rig) : fp32_rig.status();
      }
      std::filesystem::remove(fp32_dir, error);
      if (!speedup.ok()) return speedup.status();
    }
  }
  rig->reset();
  const double step_seconds = steps->step_seconds;
  const double params_per_s = o.num_params / step_seconds;
  const double read_bytes_per_step = steps->read_bytes_per_step;
  const double written_bytes_per_step = steps->written_bytes_per_step;
  if (absl::StatusOr<DiskRates> again = MeasureDisk(nvme, fio_bytes); again.ok()) {
    disk = Better(*disk, *again);
  }
  const FioMixed& mixed = disk->mixed;
  // The disk moves at most mixed.read + mixed.write GB/s when it reads and
  // writes at once; a step needs its bytes per parameter of both.
  const double bytes_per_param = (read_bytes_per_step + written_bytes_per_step) / o.num_params;
  const double bound = (mixed.read_GBps + mixed.write_GBps) * 1e9 / bytes_per_param;
  // Whatever the disk shares between reading and writing, a step reads no
  // faster than fio reads alone and writes no faster than it writes alone:
  // a limit no step can pass, where fio's mixed run (one stream, reads and
  // writes alternating) can be the slower pattern of the two.
  const double solo_bound =
      std::min(disk->read_GBps * 1e9 / (read_bytes_per_step / o.num_params),
               disk->write_GBps * 1e9 / (written_bytes_per_step / o.num_params));
  json result{{"bench", "nvme-step"},
              {"params", o.num_params},
              {"state", o.state},
              {"nvme_executor_threads", nvme.executor_threads},
              {"threads", options.threads},
              {"queue_depth", nvme.queue_depth},
              {"io_bytes", nvme.io_bytes},
              {"params_per_s", params_per_s},
              {"bytes_per_param", bytes_per_param},
              {"read_GBps", read_bytes_per_step / step_seconds / 1e9},
              {"write_GBps", written_bytes_per_step / step_seconds / 1e9},
              {"fio_write_GBps", disk->write_GBps},
              {"fio_read_GBps", disk->read_GBps},
              {"fio_mixed_read_GBps", mixed.read_GBps},
              {"fio_mixed_write_GBps", mixed.write_GBps},
              {"bound_params_per_s", bound},
              {"fraction_of_bound", params_per_s / bound},
              {"solo_bound_params_per_s", solo_bound},
              {"fraction_of_solo_bound", params_per_s / solo_bound}};
  if (speedup.ok()) {
    result["fp32_params_per_s"] = o.num_params / speedup->fp32_step_seconds;
    result["speedup_over_fp32"] = speedup->speedup;
  }
  if (!fp32_skipped.empty()) result["fp32_skipped"] = fp32_skipped;
  result["host_budget_MiB"] = steps->host_budget_bytes >> 20;
  result["peak_rss_MiB"] = peak_rss_bytes >> 20;
  result.update(steps->host_figures);
  return result;
}

}  // namespace strata
