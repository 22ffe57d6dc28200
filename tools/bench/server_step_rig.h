// ServerStepRig: a shard server's whole step over its chunks without the
// network, for the server-step, gpu-step and nvme-step benches: gradients
// arrive as 2 MiB pieces (as pushes do), are staged into their chunks, and
// each completed chunk is applied on a pool of T threads (as the step
// executor does). Not thread-safe: one caller steps it at a time.
#ifndef STRATA_TOOLS_BENCH_SERVER_STEP_RIG_H_
#define STRATA_TOOLS_BENCH_SERVER_STEP_RIG_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"
#include "rpc/grpc_util.h"
#include "shard/chunk.h"
#include "shard/gpu_chunk_state.h"
#include "storage/host_tier.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/kernel_bench.h"

namespace strata {

// Chunks of N parameters, their pushed pieces, and a timed step over them.
class ServerStepRig {
 public:
  // States of `precision` in `tier` (NVMe or GPU: through a staging pool)
  // when given, else in host memory. The copies (and staging buffers) are in a host tier
  // of the rig's own, sized for what it holds.
  static absl::StatusOr<std::unique_ptr<ServerStepRig>> Create(
      const KernelBenchOptions& o, Tier* tier, StatePrecision precision = StatePrecision::kFp32) {
    Tier* nvme = tier != nullptr && tier->kind() == TierKind::kNvme ? tier : nullptr;
    const uint64_t num_chunks = (o.num_params + kBenchChunkElements - 1) / kBenchChunkElements;
    const uint64_t staging_bytes =
        nvme != nullptr ? NvmeChunkState::StagingBytes({kBenchChunkElements, precision})
                        : GpuStagingBytes(kBenchChunkElements, o.grad_dtype);
    const uint64_t host_bytes =
        num_chunks * (tier != nullptr ? ChunkCopyBytes(kBenchChunkElements, o.grad_dtype)
                                      : ChunkBytes(kBenchChunkElements, o.grad_dtype, precision)) +
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
    if (nvme != nullptr) rig->nvme_slots_ = std::make_unique<NvmeSlots>(nvme, o.threads + 1);
    for (size_t begin = 0; begin < o.num_params; begin += kBenchChunkElements) {
      size_t size = std::min(kBenchChunkElements, o.num_params - begin);
      absl::StatusOr<Extent> copy = host->Allocate(ChunkCopyBytes(size, o.grad_dtype));
      if (!copy.ok()) return copy.status();
      const StateShape shape{size, precision};
      absl::StatusOr<std::unique_ptr<ChunkState>> state =
          nvme != nullptr   ? NvmeChunkState::Create(rig->nvme_slots_.get(), staging, shape)
          : tier != nullptr ? CreateGpuChunkState(tier, staging, shape, o.grad_dtype)
                            : HostChunkState::Create(host, shape);
      if (!state.ok()) return state.status();
      rig->chunks_.push_back(std::make_shared<Chunk>(
          "bench", static_cast<uint32_t>(rig->chunks_.size()), FlatRange{begin, begin + size},
          o.grad_dtype, AdamConfig{}, *std::move(state), host, *copy));
    }
    // The pushed pieces of one chunk, as gRPC would hold them: one buffer
    // per piece, of gradients 1e-3 (normal in every dtype). Every chunk
    // stages the same ones (the chunks only read them), so the rig's memory
    // is its chunks' copies whatever the parameters.
    std::vector<float> values(rig->piece_params_, 1e-3f);
    const size_t chunk_params = std::min(kBenchChunkElements, o.num_params);
    for (size_t begin = 0; begin < chunk_params; begin += rig->piece_params_) {
      rig->pieces_.emplace_back(rig->piece_params_ * esize, '\0');
      CastFromFloat(values.data(), o.grad_dtype, rig->pieces_.back().data(), rig->piece_params_);
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
        const absl::string_view piece =
            absl::string_view(pieces_[(b - chunk.range().begin) / piece_params_])
                .substr(0, size * esize_);
        absl::StatusOr<bool> complete =
            chunk.Stage(step_, PushRound{1}, b, size, piece, StepScalars{1.0f},
                        [&error](absl::Status s) { error.Update(s); });
        if (!complete.ok()) return complete.status();
        if (*complete) chunk.Apply();
      }
      return error;
    });
  }

  // The rig's host tier's budget: the chunks' copies (and states, unless
  // in another tier) and staging buffers.
  uint64_t host_budget_bytes() const { return host_.budget_bytes(); }

  // The median of `reps` steps after one warm-up.
  absl::StatusOr<double> MedianStepSeconds() {
    return MedianSeconds([this] { return Step(); });
  }

 private:
  ServerStepRig(const KernelBenchOptions& o, uint64_t host_bytes, HostTier::Pinning pinning)
      : reps_(o.reps),
        esize_(DTypeSize(o.grad_dtype)),
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
  const size_t esize_;
  const size_t piece_params_;
  HostTier host_;                          // before the chunks, which free their extents into it
  std::unique_ptr<NvmeSlots> nvme_slots_;  // NVMe-tier chunks' slots, before the chunks too
  std::vector<std::shared_ptr<Chunk>> chunks_;
  std::vector<std::string> pieces_;  // one chunk's
  int64_t step_ = 0;
  ThreadPool executor_;  // last: its threads finish before the chunks go
};

// The server benches take pushed gradients in FP16 or BF16;
// INVALID_ARGUMENT for FP32.
inline absl::Status CheckDtype(const KernelBenchOptions& o) {
  if (o.grad_dtype == DType::kFp32) return absl::InvalidArgumentError("needs --grad fp16 or bf16");
  return absl::OkStatus();
}

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_SERVER_STEP_RIG_H_
