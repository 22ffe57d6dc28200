// strata-bench step: the whole optimizer path of a step on loopback
// (reduce-scatter, push, apply, pull, all-gather; no model) with W worker
// threads and S in-process shard servers, and loopback TCP measured with
// iperf3 (its best way, tools/bench/iperf.h) in the same run; with a TLS
// directory, the same steps again over TLS on a fresh cluster, then a
// plaintext and a TLS cluster taking turns (alternating_jobs.h) for the
// TLS step's ratio to the plaintext one and its floor (each plaintext
// turn's busy CPU plus the cipher of every byte). Returns the JSON object
// to print.
#ifndef STRATA_TOOLS_BENCH_STEP_BENCH_H_
#define STRATA_TOOLS_BENCH_STEP_BENCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "strata/types.h"

namespace strata {

struct StepBenchOptions {
  uint64_t num_params = uint64_t{64} << 20;
  int workers = 2;
  int servers = 2;
  int executor_threads = 1;
  DType dtype = DType::kFp16;
  int steps = 5;
  bool quiet = false;  // no per-step lines on stderr
  // Non-empty: also run the steps with TLS on every channel (certificates
  // made here by openssl) and report the ratio to plaintext.
  std::string tls_dir;
  // Non-empty: the cluster whose coordinator serves at this HOST:PORT (and
  // its `servers` shard servers, each with room for the job), not a
  // loopback one; the workers still run here. Not with tls_dir.
  std::string coordinator;
  // Non-empty: HOST:PORT of an `iperf3 -s` on a server's host, the link's
  // limit (default: loopback's).
  std::string iperf3_server;
};

absl::StatusOr<nlohmann::json> BenchStep(const StepBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_STEP_BENCH_H_
