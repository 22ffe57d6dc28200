// strata-bench elastic: pauses of an elastic job. Worker processes (this
// binary again, as `strata-bench elastic-worker`) train a job on an
// in-process cluster; a third worker joins, one leaves gracefully, the
// joiner is killed with SIGKILL, and a fourth joins and is stopped with
// SIGSTOP; last a shard server restarts cleanly (LocalCluster::RestartServer,
// its host chunks saved and brought back). From the workers' event logs it
// reports what each change cost the survivor, worker a: for a join and a
// leave, the stall it saw (the gap before its first step in the new
// generation, less its median step); for the kill and the stop, the time
// from the signal to its first step in the generation without that worker;
// for the restart, the gap from its last step before the restart to its
// first after, less its median step, against the restart's own time
// (restart_s). Also the joiner's parameter pull and the lease, and whether
// the targets hold:
//   join_pause_s <= 1 + param_pull_s, leave_pause_s <= 1,
//   failure_pause_s <= 0.5, hang_pause_s <= lease_s + 1,
//   restart_pause_s <= restart_s.
#ifndef STRATA_TOOLS_BENCH_ELASTIC_BENCH_H_
#define STRATA_TOOLS_BENCH_ELASTIC_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace strata {

struct ElasticBenchOptions {
  uint64_t num_params = uint64_t{4} << 20;
  absl::Duration lease = absl::Seconds(1);
};

absl::StatusOr<nlohmann::json> BenchElastic(const ElasticBenchOptions& options);

// The worker process: args are {"elastic-worker", coordinator, job, worker
// id, num_params, steps, leave after step (0: never), event log}.
int RunElasticWorker(const std::vector<std::string>& args);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_ELASTIC_BENCH_H_
