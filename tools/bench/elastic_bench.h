// strata-bench elastic: pauses of an elastic job. Worker processes (this
// binary again, as `strata-bench elastic-worker`) train a job on an
// in-process cluster; a third worker joins, one leaves gracefully, and the
// joiner is killed with SIGKILL. From the workers' event logs it reports how
// long each change stalled training, the joiner's parameter pull and the
// lease, and whether the targets hold:
//   join_pause_s <= 1 + param_pull_s, leave_pause_s <= 1,
//   failure_pause_s <= lease_s + 1.
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
