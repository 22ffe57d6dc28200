// strata-bench checkpoint: a job of N parameters on S in-process shard
// servers (host-tier chunks) trains without pause while a checkpoint of it is
// saved into DIR; then a new job is restored from that checkpoint. Against
// fio's sequential direct write (the save) and read (the restore) of the
// checkpoint's bytes, once, on DIR in the same run (a 4-s fio run measured
// this cloud disk's sustained rate, which a 1-s save beat by 17%). Reports the save's and restore's
// times and rates, and the training pause the save caused: the time the steps overlapping the save
// took beyond the median step (timed once the servers have faulted in the
// memory for the saves' second buffers, `fault_in_s` after start); the
// same for a second save two steps later (whose second buffers come from the
// memory the first left in the arena); and the memory the servers' second
// buffers and copies took (server/state_arena.h).
// Returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_CHECKPOINT_BENCH_H_
#define STRATA_TOOLS_BENCH_CHECKPOINT_BENCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "shard/shard_server.h"

namespace strata {

struct CheckpointBenchOptions {
  uint64_t num_params = uint64_t{64} << 20;
  std::string dir;
  int servers = 2;
  int executor_threads = 1;
  // Per server: host memory kept for the states checkpoints keep aside, and
  // the most they may take.
  uint64_t checkpoint_buffer_bytes = uint64_t{384} << 20;
  uint64_t checkpoint_memory_limit_bytes = ShardServerOptions::kDefaultCheckpointMemoryLimitBytes;
  // Per server: host memory faulted in at start-up (at most its budget,
  // which the JSON reports).
  uint64_t host_prefault_bytes = 0;
};

absl::StatusOr<nlohmann::json> BenchCheckpoint(const CheckpointBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_CHECKPOINT_BENCH_H_
