// strata-bench failover: what replicated chunks cost and what they save. A
// coordinator and three shard servers run as processes on loopback. First
// a job of one copy per chunk and a job of two copies train in turns
// (alternating_jobs.h; two worker threads each, Step(GradientFn), the same
// gradients), then are deleted: the median of each turn's step over the
// other job's just before it is the price of the second copy
// (replicas_2_over_1; target <= 1.25), beside the CPU time of each job's
// step (the machine's busy time: workers, daemons, kernel) and the least
// the ratio can be on this machine (replicas_2_floor_over_1: the one-copy
// step's CPU time and one more AdamW pass over every parameter, spread over
// every core, or the one-copy step if longer). Then two worker threads train a job
// of one copy, then one of two copies, one after the other (their medians'
// ratio: replicas_2_over_1_separate_jobs). While the first of these
// trains, server 0 is drained: drain_s,
// the bytes it moved per second against loopback TCP (MeasureIperf3:
// iperf3's best; target >= 0.5) with the cores idle and, just before the
// drain, while the job trains (the cores the drain shares with it), and
// the longest step meanwhile; once done
// (no worker left), a rebalance moves copies back onto server 0 with the
// cores idle: the move's own rate (idle_rebalance_*). While the second
// trains, another server is SIGKILLed and never restarted: steps_lost
// (target 0) and pause_s, from the kill to the next completed step,
// against its bound -- the coordinator's server timeout (the detection)
// plus 1 s --, detection_s, from the kill until the server's copies left
// the placement (pause_beyond_detection_s: pause_s less it; target <= 1 s),
// and reseed_s, from the kill until every chunk has two copies again.
#ifndef STRATA_TOOLS_BENCH_FAILOVER_BENCH_H_
#define STRATA_TOOLS_BENCH_FAILOVER_BENCH_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace strata {

struct FailoverBenchOptions {
  uint64_t num_params = uint64_t{16} << 20;
  int steps = 8;  // timed steps of each job
  absl::Duration server_timeout = absl::Seconds(1);
  uint64_t host_prefault_mib = 0;  // each server's --host_prefault_mib
};

absl::StatusOr<nlohmann::json> BenchFailover(const FailoverBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_FAILOVER_BENCH_H_
