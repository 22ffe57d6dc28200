// strata-bench server-step and nvme-step: a shard server's whole step over
// its chunks without the network: gradients arrive as 2 MiB pieces (as
// pushes do), are staged into their chunks, and each completed chunk is
// applied on a pool of T threads (as the step executor does).
//  - server-step: chunks in the host tier; against the AdamW kernel alone over
//    the same N and T, in the same run.
//  - gpu-step: chunks in a GPU tier on GPU 0 (AdamW on the GPU); against the
//    bus it needs, timed in the same run: e bytes per parameter go to the GPU
//    (the gradient) while e come back (the copy), so the bound is
//    min(to_gpu, from_gpu) / e parameters per second, with both directions
//    timed at once over pinned memory, 4 copies in flight each way; and
//    beside the same step over host-tier chunks.
//    FAILED_PRECONDITION without a GPU.
//  - nvme-step: chunks on the NVMe tier in DIR (read p, m, v; apply; write
//    back); against fio on the same directory with the same I/O size and queue
//    depth, in the same run: the bound is 1 / (12 / fio_read + 12 / fio_write)
//    parameters per second. With host_params M, also a step over M parameters
//    of host-tier chunks on a pool of its own (as a server's host executor),
//    alone and while the NVMe steps run: how much an NVMe tier holding other
//    chunks slows the host-tier step down.
// Each returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/bench/kernel_bench.h"

namespace strata {

struct NvmeBenchOptions {
  std::string dir;
  unsigned queue_depth = 32;
  uint64_t io_bytes = uint64_t{1} << 20;
  uint64_t host_params = 0;
};

absl::StatusOr<nlohmann::json> BenchServerStep(const KernelBenchOptions& options);
absl::StatusOr<nlohmann::json> BenchGpuStep(const KernelBenchOptions& options);
absl::StatusOr<nlohmann::json> BenchNvmeStep(const KernelBenchOptions& options,
                                             const NvmeBenchOptions& nvme);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_SERVER_STEP_BENCH_H_
