// strata-bench load: a coordinator and two shard servers, started as
// processes (build/bin's daemons) on loopback, driven by C concurrent
// clients for S seconds: a fifth train small jobs of their own (steps:
// pushes, pulls and heartbeats), a fifth hold generation watches, a fifth
// set and get rendezvous keys, a fifth read placements, jobs and members,
// and a fifth send bad requests (unknown jobs, hostile paths, huge sizes,
// keys outside any job) that must be refused with their codes. Measures,
// per RPC, p50 and p99 latency under load against the p50 of the same RPC
// from one client on the idle cluster in the same run; counts errors
// beyond those expected; and reads each daemon's peak RSS (VmHWM) against
// a stated bound: its tier budgets plus kDaemonOverheadBytes. Bounded in
// clients, time and memory; loopback only.
#ifndef STRATA_TOOLS_BENCH_LOAD_BENCH_H_
#define STRATA_TOOLS_BENCH_LOAD_BENCH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace strata {

struct LoadBenchOptions {
  int clients = 200;
  absl::Duration duration = absl::Seconds(60);
};

// A daemon's memory beyond its tier budgets that the bench accepts.
inline constexpr uint64_t kDaemonOverheadBytes = uint64_t{512} << 20;

absl::StatusOr<nlohmann::json> BenchLoad(const LoadBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_LOAD_BENCH_H_
