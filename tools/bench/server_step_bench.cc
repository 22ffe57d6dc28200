#include "tools/bench/server_step_bench.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/isa.h"
#include "rpc/grpc_util.h"
#include "shard/chunk.h"
#include "shard/gpu_chunk_state.h"
#include "storage/gpu_tier.h"
#include "storage/host_tier.h"
#include "storage/nvme_tier.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/fio.h"

namespace strata {
namespace {

using nlohmann::json;

// Chunks of N parameters, their pushed pieces, and a timed step over them.
class ServerStepRig {
 public:
  // States in `tier` (NVMe: through a staging pool; GPU) when given, else
  // in host memory. The copies (and staging buffers) are in a host tier of
  // the rig's own, sized for what it holds.
  static absl::StatusOr<std::unique_ptr<ServerStepRig>> Create(const KernelBenchOptions& o,
                                                               Tier* tier) {
    Tier* nvme = tier != nullptr && tier->kind() == TierKind::kNvme ? tier : nullptr;
    const uint64_t num_chunks = (o.num_params + kBenchChunkElements - 1) / kBenchChunkElements;
    const uint64_t staging_bytes = nvme != nullptr
                                       ? NvmeChunkState::StagingBytes(kBenchChunkElements)
                                       : GpuStagingBytes(kBenchChunkElements, o.grad_dtype);
    const uint64_t host_bytes =
        num_chunks * (tier != nullptr ? ChunkCopyBytes(kBenchChunkElements, o.grad_dtype)
                                      : ChunkBytes(kBenchChunkElements, o.grad_dtype)) +
        (tier != nullptr ? (o.threads + 1) * (staging_bytes + 4096) : 0) + (uint64_t{64} << 20);
    // Pinned for the GPU as a server pins it (the copies come back by DMA).
    std::unique_ptr<ServerStepRig> rig(new ServerStepRig(
        o, host_bytes,
        nvme == nullptr && tier != nullptr ? HostTier::Pinning::kGpu : HostTier::Pinning::kNone));
    HostTier* host = &rig->host_;
    const size_t esize = DTypeSize(o.grad_dtype);
    std::shared_ptr<StagingPool> staging;
    if (tier != nullptr) {
      absl::StatusOr<std::unique_ptr<StagingPool>> pool =
          StagingPool::Create(host, staging_bytes, o.threads + 1);
      if (!pool.ok()) return pool.status();
      staging = *std::move(pool);
    }
    for (size_t begin = 0; begin < o.num_params; begin += kBenchChunkElements) {
      size_t size = std::min(kBenchChunkElements, o.num_params - begin);
      absl::StatusOr<Extent> copy = host->Allocate(ChunkCopyBytes(size, o.grad_dtype));
      if (!copy.ok()) return copy.status();
      absl::StatusOr<std::unique_ptr<ChunkState>> state =
          nvme != nullptr   ? NvmeChunkState::Create(nvme, staging, size)
          : tier != nullptr ? CreateGpuChunkState(tier, staging, size, o.grad_dtype)
                            : HostChunkState::Create(host, size);
      if (!state.ok()) return state.status();
      rig->chunks_.push_back(std::make_shared<Chunk>(
          "bench", static_cast<uint32_t>(rig->chunks_.size()), FlatRange{begin, begin + size},
          o.grad_dtype, AdamConfig{}, *std::move(state), host, *copy));
    }
    // The pushed pieces, as gRPC would hold them: one buffer per piece, of
    // gradients 1e-3 (normal in every dtype).
    std::vector<float> values(rig->piece_params_, 1e-3f);
    for (size_t begin = 0; begin < o.num_params; begin += rig->piece_params_) {
      size_t size = std::min(rig->piece_params_, o.num_params - begin);
      rig->pieces_.emplace_back(size * esize, '\0');
      CastFromFloat(values.data(), o.grad_dtype, rig->pieces_.back().data(), size);
    }
    return rig;
  }

  // One step; its wall time in seconds. The reactors' staging runs on the
  // pool too, one task per chunk's pieces, as concurrent pushes would; the
  // pieces stay alive, as held push requests do.
  absl::StatusOr<double> Step() {
    ++step_;
    return OverChunks([this](size_t c) {
      Chunk& chunk = *chunks_[c];
      absl::Status error;
      for (uint64_t b = chunk.range().begin; b < chunk.range().end; b += piece_params_) {
        uint64_t size = std::min<uint64_t>(piece_params_, chunk.range().end - b);
        absl::StatusOr<bool> complete =
            chunk.Stage(step_, /*generation=*/1, b, size, pieces_[b / piece_params_], {1.0f},
                        [&error](absl::Status s) { error.Update(s); });
        if (!complete.ok()) return complete.status();
        if (*complete) chunk.Apply();
      }
      return error;
    });
  }

  // The median of `reps` steps after one warm-up.
  absl::StatusOr<double> MedianStepSeconds() {
    return MedianSeconds([this] { return Step(); });
  }

 private:
  ServerStepRig(const KernelBenchOptions& o, uint64_t host_bytes, HostTier::Pinning pinning)
      : reps_(o.reps),
        piece_params_(kMaxPayloadBytes / DTypeSize(o.grad_dtype)),
        host_(host_bytes, pinning),
        executor_(o.threads) {}

  // Runs per_chunk(c) for every chunk, one task each on the pool; the wall
  // time in seconds, or the first error.
  absl::StatusOr<double> OverChunks(absl::FunctionRef<absl::Status(size_t)> per_chunk) {
    absl::BlockingCounter done(static_cast<int>(chunks_.size()));
    std::vector<absl::Status> errors(chunks_.size());
    absl::Time started = absl::Now();
    for (size_t c = 0; c < chunks_.size(); ++c) {
      executor_.Schedule([&, c] {
        errors[c] = per_chunk(c);
        done.DecrementCount();
      });
    }
    done.Wait();
    for (const absl::Status& e : errors) {
      if (!e.ok()) return e;
    }
    return absl::ToDoubleSeconds(absl::Now() - started);
  }

  // The median of `reps_` runs of `run` after one warm-up.
  absl::StatusOr<double> MedianSeconds(absl::FunctionRef<absl::StatusOr<double>()> run) {
    if (absl::StatusOr<double> warm = run(); !warm.ok()) return warm.status();
    std::vector<double> seconds;
    for (int r = 0; r < reps_; ++r) {
      absl::StatusOr<double> s = run();
      if (!s.ok()) return s.status();
      seconds.push_back(*s);
    }
    return Median(seconds);
  }

  const int reps_;
  const size_t piece_params_;
  HostTier host_;  // before the chunks, which free their extents into it
  std::vector<std::shared_ptr<Chunk>> chunks_;
  std::vector<std::string> pieces_;
  int64_t step_ = 0;
  ThreadPool executor_;  // last: its threads finish before the chunks go
};

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

absl::Status CheckDtype(const KernelBenchOptions& o) {
  if (o.grad_dtype == DType::kFp32) return absl::InvalidArgumentError("needs --grad fp16 or bf16");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> BenchServerStep(const KernelBenchOptions& o) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ServerStepRig>> rig = ServerStepRig::Create(o, nullptr);
  if (!rig.ok()) return rig.status();
  absl::StatusOr<json> kernel = BenchAdam(o);
  if (!kernel.ok()) return kernel.status();
  absl::StatusOr<double> step_s = (*rig)->MedianStepSeconds();
  if (!step_s.ok()) return step_s.status();
  double params_per_s = o.num_params / *step_s;
  double kernel_params_per_s = (*kernel)["params_per_s"].get<double>();
  return json{{"bench", "server-step"},
              {"isa", IsaName(ActiveIsa())},
              {"params", o.num_params},
              {"threads", o.threads},
              {"dtype", DTypeName(o.grad_dtype)},
              {"params_per_s", params_per_s},
              {"kernel_params_per_s", kernel_params_per_s},
              {"fraction_of_kernel", params_per_s / kernel_params_per_s},
              {"kernel_fraction_of_bound", (*kernel)["fraction_of_bound"]}};
}

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

absl::StatusOr<json> BenchGpuStep(const KernelBenchOptions& o) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Tier>> gpu = OpenGpuTier(0, 0);
  if (!gpu.ok()) return gpu.status();
  absl::StatusOr<std::unique_ptr<ServerStepRig>> rig = ServerStepRig::Create(o, gpu->get());
  if (!rig.ok()) return rig.status();
  // The bound: each parameter's gradient in and copy out, both ways at once.
  absl::StatusOr<std::pair<double, double>> bus = BusBytesPerSecond(**gpu, o.reps);
  if (!bus.ok()) return bus.status();
  absl::StatusOr<double> step_s = (*rig)->MedianStepSeconds();
  if (!step_s.ok()) return step_s.status();
  rig->reset();
  absl::StatusOr<std::unique_ptr<ServerStepRig>> host_rig = ServerStepRig::Create(o, nullptr);
  if (!host_rig.ok()) return host_rig.status();
  absl::StatusOr<double> host_step_s = (*host_rig)->MedianStepSeconds();
  if (!host_step_s.ok()) return host_step_s.status();
  const double params_per_s = o.num_params / *step_s;
  const double bound = std::min(bus->first, bus->second) / DTypeSize(o.grad_dtype);
  return json{{"bench", "gpu-step"},
              {"params", o.num_params},
              {"threads", o.threads},
              {"dtype", DTypeName(o.grad_dtype)},
              {"params_per_s", params_per_s},
              {"to_gpu_GBps", bus->first / 1e9},
              {"from_gpu_GBps", bus->second / 1e9},
              {"bound_params_per_s", bound},
              {"fraction_of_bound", params_per_s / bound},
              {"host_tier_params_per_s", o.num_params / *host_step_s},
              {"speedup_vs_host_tier", *host_step_s / *step_s}};
}

absl::StatusOr<json> BenchNvmeStep(const KernelBenchOptions& o, const NvmeBenchOptions& nvme) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  if (nvme.dir.empty()) return absl::InvalidArgumentError("nvme-step needs --dir");
  const uint64_t state_bytes = o.num_params * 12;
  double fio_read = 0, fio_write = 0, params_per_s = 0;
  json host_figures;
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
