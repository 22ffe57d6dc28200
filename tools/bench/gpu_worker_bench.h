// strata-bench gpu-worker: one worker's whole optimizer step with its
// buffers on GPU 0 (ClientOptions::device "cuda:0", NCCL in place, the slice
// through pinned host memory) against shard servers on the same host's
// memory (an in-process cluster on loopback), beside the same step with the
// worker's buffers in host memory (Gloo), and against the limit a GPU
// trainer would otherwise pay: one fused AdamW over the same parameters
// with its states in GPU memory (CUDA's kernel, timed in the same run).
// A step here is what Step() costs the trainer: accumulate the gradients,
// Step(), CopyParams() into the model's FP32 parameters. FAILED_PRECONDITION
// without a GPU. Returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_GPU_WORKER_BENCH_H_
#define STRATA_TOOLS_BENCH_GPU_WORKER_BENCH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "strata/types.h"

namespace strata {

struct GpuWorkerBenchOptions {
  uint64_t num_params = uint64_t{64} << 20;
  int servers = 2;
  int executor_threads = 4;  // per server
  DType dtype = DType::kFp16;
  int steps = 5;  // timed, after 2 untimed
};

absl::StatusOr<nlohmann::json> BenchGpuWorker(const GpuWorkerBenchOptions& options);

// The median time of the fused AdamW kernel over `num_params` with every
// operand in GPU 0's memory (FP32 p, m, v; `dtype` gradients and copy).
// FAILED_PRECONDITION without CUDA or a GPU.
absl::StatusOr<double> GpuFusedAdamSeconds(uint64_t num_params, DType dtype);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_GPU_WORKER_BENCH_H_
