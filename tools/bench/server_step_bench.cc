#include "tools/bench/server_step_bench.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/isa.h"
#include "server/chunk.h"
#include "storage/host_tier.h"
#include "tools/bench/bench_util.h"

namespace strata {

absl::StatusOr<nlohmann::json> BenchServerStep(const KernelBenchOptions& o) {
  if (o.grad_dtype == DType::kFp32)
    return absl::InvalidArgumentError("server-step needs fp16 or bf16");
  const size_t n = o.num_params;
  const DType dtype = o.grad_dtype;
  const size_t esize = DTypeSize(dtype);
  const size_t chunk_params = kBenchChunkElements;
  const size_t piece_params = kMaxPayloadBytes / esize;
  HostTier tier(Chunk::NumBytes(n, dtype) + (size_t{64} << 20));
  std::vector<std::shared_ptr<Chunk>> chunks;
  for (size_t begin = 0; begin < n; begin += chunk_params) {
    size_t size = std::min(chunk_params, n - begin);
    absl::StatusOr<Extent> copy = tier.Allocate(size * esize);
    if (!copy.ok()) return copy.status();
    absl::StatusOr<std::unique_ptr<ChunkState>> state = HostChunkState::Create(&tier, size);
    if (!state.ok()) return state.status();
    chunks.push_back(std::make_shared<Chunk>("bench", static_cast<uint32_t>(chunks.size()),
                                             FlatRange{begin, begin + size}, dtype, AdamConfig{},
                                             *std::move(state), &tier, *copy));
  }
  // The pushed pieces, as gRPC would hold them: one buffer per piece, of
  // gradients 1e-3 (normal in every dtype).
  std::vector<std::string> pieces;
  std::vector<float> values(piece_params, 1e-3f);
  for (size_t begin = 0; begin < n; begin += piece_params) {
    size_t size = std::min(piece_params, n - begin);
    pieces.emplace_back(size * esize, '\0');
    CastFromFloat(values.data(), dtype, pieces.back().data(), size);
  }
  ThreadPool executor(o.threads);
  int64_t step = 0;
  auto server_step = [&]() -> absl::StatusOr<double> {
    ++step;
    absl::BlockingCounter applied(static_cast<int>(chunks.size()));
    absl::Time started = absl::Now();
    // The reactors' work (staging) runs on the pool too, one task per chunk's
    // pieces, as concurrent pushes would; the pieces stay alive, as held
    // push requests do.
    std::vector<absl::Status> errors(chunks.size());
    for (size_t c = 0; c < chunks.size(); ++c) {
      executor.Schedule([&, c] {
        Chunk& chunk = *chunks[c];
        for (uint64_t b = chunk.range().begin; b < chunk.range().end; b += piece_params) {
          uint64_t size = std::min<uint64_t>(piece_params, chunk.range().end - b);
          absl::StatusOr<bool> complete =
              chunk.Stage(step, b, size, pieces[b / piece_params], 1.0f, [](absl::Status) {});
          if (!complete.ok()) errors[c] = complete.status();
          if (complete.ok() && *complete) chunk.Apply();
        }
        applied.DecrementCount();
      });
    }
    applied.Wait();
    for (const absl::Status& e : errors) {
      if (!e.ok()) return e;
    }
    return absl::ToDoubleSeconds(absl::Now() - started);
  };
  absl::StatusOr<nlohmann::json> kernel = BenchAdam(o);
  if (!kernel.ok()) return kernel.status();
  if (absl::StatusOr<double> warm = server_step(); !warm.ok()) return warm.status();
  std::vector<double> seconds;
  for (int r = 0; r < o.reps; ++r) {
    absl::StatusOr<double> s = server_step();
    if (!s.ok()) return s.status();
    seconds.push_back(*s);
  }
  double params_per_s = n / Median(seconds);
  double kernel_params_per_s = (*kernel)["params_per_s"].get<double>();
  return nlohmann::json{{"bench", "server-step"},
                        {"isa", IsaName(ActiveIsa())},
                        {"params", n},
                        {"threads", o.threads},
                        {"dtype", DTypeName(dtype)},
                        {"params_per_s", params_per_s},
                        {"kernel_params_per_s", kernel_params_per_s},
                        {"fraction_of_kernel", params_per_s / kernel_params_per_s},
                        {"kernel_fraction_of_bound", (*kernel)["fraction_of_bound"]}};
}

}  // namespace strata
