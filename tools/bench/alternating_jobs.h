// TrainAlternately: two jobs trained in turns on one cluster, so that each
// job's step is timed a moment after the other's -- on a shared machine the
// speed drifts over the minutes between two jobs trained one after the
// other, by more than some of the differences a bench compares. Job 0 takes
// `steps_per_turn` steps, then job 1 as many, and so on: one untimed turn
// each (job 1's workers connect while job 0's first turn runs), then
// `turns` timed turns each. Only the last step of a turn is timed (the first
// may meet work the other job's last step left on the servers, such as a
// copy's apply). Each job trains with `workers` worker threads, each
// accumulating `grads` in every step (Step(GradientFn)); the workers have
// left when it returns (after their last step, announced), the jobs remain.
// Given `cpu_seconds` (a clock of the CPU time the jobs spend, in seconds),
// the CPU time of each timed step too, read as the step is timed. Blocks
// the calling thread; thread-safe, and so must `cpu_seconds` be (the
// workers call it at once).
#ifndef STRATA_TOOLS_BENCH_ALTERNATING_JOBS_H_
#define STRATA_TOOLS_BENCH_ALTERNATING_JOBS_H_

#include <array>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/client.h"

namespace strata {

struct AlternatingSteps {
  // Rank 0's timed step of each turn, for each job.
  std::array<std::vector<double>, 2> seconds;
  // The CPU seconds spent during each of those steps (empty without a
  // clock).
  std::array<std::vector<double>, 2> cpu_seconds;
  // seconds[1][i] / seconds[0][i]: each of job 1's turns over job 0's
  // turn just before it.
  std::vector<double> Ratios() const;
  // With the CPU clock, per turn: job 1's step's CPU seconds over job 0's
  // (0 where job 0's read 0), and job 1's less job 0's.
  std::vector<double> CpuRatios() const;
  std::vector<double> AddedCpuSeconds() const;
  // With the CPU clock, per turn, the least job 1's step can be over job
  // 0's on this machine when it does job 0's work and `added_cpu_s` more:
  // that CPU time spread over every core, or job 0's step if longer.
  std::vector<double> FloorRatios(double added_cpu_s) const;
};

// Fails with the first worker's error (the others' turns then end too).
// Each job's options must leave worker_id empty: workers are named
// "<job_id>-<w>".
absl::StatusOr<AlternatingSteps> TrainAlternately(
    const std::array<ClientOptions, 2>& jobs, const std::vector<float>& grads, int workers,
    int turns, int steps_per_turn, const std::function<double()>& cpu_seconds = nullptr);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_ALTERNATING_JOBS_H_
