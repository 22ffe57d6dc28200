// Test helper: TrainThroughAKill() trains a job with its workers as threads
// (Step(GradientFn)) while a shard server process is SIGKILLed during one
// step, and returns what each rank saw: the steps it completed, its last
// re-forming, the pause rank 0 saw, and the final master state.
#ifndef STRATA_TESTING_SERVER_KILL_H_
#define STRATA_TESTING_SERVER_KILL_H_

#include <signal.h>
#include <sys/wait.h>

#include <functional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "strata/client.h"
#include "testing/job_runner.h"
#include "testing/processes.h"

namespace strata::testing {

// Who is killed, when, and what runs around it (under the helper's lock,
// from the worker thread that kills).
struct ServerKill {
  ServerProcess* victim = nullptr;  // null: nothing is killed
  Processes* daemons = nullptr;     // the victim's, which forgets it
  int64_t during_step = 0;          // before the first micro-batch of this step
  std::function<void()> before = [] {};
  std::function<void()> after = [] {};
};

struct KilledRun {
  std::vector<std::vector<int64_t>> steps;  // completed, per rank
  std::vector<ReformStats> reforms;         // the last re-forming, per rank
  std::vector<int> num_servers;             // Client::num_servers() at the end, per rank
  double paused_s = 0;                      // from the kill to the next step completed (rank 0)
  MasterState master;                       // at the end
};

// Trains `options`' job to `steps` with `compute`, killing as `kill` says.
inline KilledRun TrainThroughAKill(const ClientOptions& options, int64_t steps,
                                   const GradientFn& compute, const ServerKill& kill) {
  absl::Mutex mu;
  bool killed = false;
  absl::Time killed_at;
  KilledRun run;
  run.steps.resize(options.job.world_size);
  run.reforms.resize(options.job.world_size);
  run.num_servers.resize(options.job.world_size);
  RunClients(options, [&](Client& client) {
    const int rank = client.rank();
    auto killing = [&](const MicroBatch& batch, Client& c) {
      {
        absl::MutexLock lock(&mu);
        if (kill.victim != nullptr && batch.step == kill.during_step && !killed) {
          kill.before();
          ::kill(kill.victim->pid, SIGKILL);
          waitpid(kill.victim->pid, nullptr, 0);
          kill.daemons->Forget(kill.victim->pid);
          killed = true;
          killed_at = absl::Now();
          kill.after();
        }
      }
      return compute(batch, c);
    };
    while (client.step() < steps) {
      absl::StatusOr<StepResult> result = client.Step(killing);
      ASSERT_TRUE(result.ok()) << result.status();
      run.steps[rank].push_back(result->step);
      absl::MutexLock lock(&mu);
      if (killed && run.paused_s == 0 && rank == 0) {
        run.paused_s = absl::ToDoubleSeconds(absl::Now() - killed_at);
      }
    }
    run.reforms[rank] = client.last_reform();
    run.num_servers[rank] = client.num_servers();
    if (rank == 0) {
      auto state = client.ReadMasterState();
      ASSERT_TRUE(state.ok()) << state.status();
      run.master = *std::move(state);
    }
  });
  EXPECT_EQ(killed, kill.victim != nullptr);
  return run;
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_SERVER_KILL_H_
