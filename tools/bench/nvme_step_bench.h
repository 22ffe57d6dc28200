// strata-bench nvme-step: a shard server's whole step over chunks on the
// NVMe tier in DIR (read p, m, v; apply; write back;
// tools/bench/server_step_rig.h, on as many threads as a server's NVMe
// executor), against fio on the same directory with the
// same I/O size and queue depth, in the same run, reading and writing at
// once (half each, durable writes, on a file written first; the better of
// a run before the steps and one after): the bound is
// (mixed_read + mixed_write) / bytes_per_param parameters per second, with
// the bytes a step reads and writes taken from the tier's counters. With
// host_params M, also a step over M parameters of host-tier chunks on a pool
// of its own (as a server's host executor), alone and while the NVMe steps
// run: how much an NVMe tier holding other chunks slows the host-tier step
// down. With 8-bit states, also FP32 states' steps in a second tier file
// beside the first, alternating step by step with the 8-bit ones
// (speedup_over_fp32: the median pair's ratio). Returns the JSON object to
// print.
#ifndef STRATA_TOOLS_BENCH_NVME_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_NVME_STEP_BENCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "shard/shard_server.h"
#include "tools/bench/kernel_bench.h"

namespace strata {

struct NvmeBenchOptions {
  std::string dir;
  unsigned queue_depth = 32;
  uint64_t io_bytes = uint64_t{1} << 20;
  int executor_threads = ShardServerOptions::kDefaultNvmeExecutorThreads;
  uint64_t host_params = 0;  // 0: no host-tier step beside the NVMe steps
};

absl::StatusOr<nlohmann::json> BenchNvmeStep(const KernelBenchOptions& options,
                                             const NvmeBenchOptions& nvme);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_NVME_STEP_BENCH_H_
