#include "tools/bench/failover_bench.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "strata/client.h"
#include "testing/processes.h"
#include "tools/bench/bench_util.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr int kServers = 3;
constexpr int kWorkers = 2;

// What rank 0 saw of a job's steps.
struct Steps {
  std::vector<double> seconds;  // each step's, killed step's excluded
  std::vector<int64_t> completed;
  double pause_s = 0;  // from the kill to the end of the next step completed
  int64_t steps_lost = 0;
};

// Trains job `job_id` of `replicas` copies for `steps` steps with two
// worker threads; before step `kill_before` (0: never) rank 0 SIGKILLs
// `victim`.
absl::StatusOr<Steps> Train(const FailoverBenchOptions& o, const std::string& coordinator,
                            const std::string& job_id, uint32_t replicas, int steps,
                            int kill_before, testing::ServerProcess* victim,
                            testing::Processes* daemons) {
  ClientOptions options;
  options.coordinator_address = coordinator;
  options.job_id = job_id;
  options.tensors = {{"flat", {static_cast<int64_t>(o.num_params)}}};
  options.world_size = kWorkers;
  options.samples_per_step = kWorkers;
  options.dtype = DType::kBf16;
  options.replicas = replicas;
  options.loss_scale.dynamic = false;
  options.loss_scale.initial_scale = 1.0f;
  Steps out;
  absl::Mutex mu;
  std::vector<absl::Status> errors(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions mine = options;
      mine.worker_id = absl::StrCat(job_id, "-", w);
      auto client = Client::Connect(mine);
      if (!client.ok()) {
        errors[w] = client.status();
        return;
      }
      const std::vector<float> grads(o.num_params, 1e-3f);
      auto compute = [&grads](const MicroBatch&, Client& c) {
        return c.AccumulateGradients(grads);
      };
      absl::Time killed_at = absl::InfiniteFuture();
      while ((*client)->step() < steps) {
        const bool kill_now =
            (*client)->rank() == 0 && victim != nullptr && (*client)->step() + 1 == kill_before;
        if (kill_now) {
          kill(victim->pid, SIGKILL);
          waitpid(victim->pid, nullptr, 0);
          daemons->Forget(victim->pid);
          killed_at = absl::Now();
        }
        const absl::Time started = absl::Now();
        absl::StatusOr<StepResult> result = (*client)->Step(compute);
        if (!result.ok()) {
          errors[w] = result.status();
          return;
        }
        if ((*client)->rank() != 0) continue;
        absl::MutexLock lock(&mu);
        out.completed.push_back(result->step);
        if (kill_now) {
          out.pause_s = absl::ToDoubleSeconds(absl::Now() - killed_at);
        } else if (result->step > 1) {  // the first pays for the connections
          out.seconds.push_back(absl::ToDoubleSeconds(absl::Now() - started));
        }
      }
      if ((*client)->rank() == 0) {
        absl::MutexLock lock(&mu);
        out.steps_lost = (*client)->last_reform().steps_lost;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& e : errors) RETURN_IF_ERROR(e);
  return out;
}

}  // namespace

absl::StatusOr<json> BenchFailover(const FailoverBenchOptions& o) {
  char pattern[] = "/tmp/strata-failover-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = pattern;
  absl::Cleanup remove_dir = [&dir] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  testing::Processes daemons;  // killed before the directory goes
  const std::string bin = BinDir();
  const std::string coordinator = testing::StartCoordinator(
      bin, dir, &daemons,
      {absl::StrCat("--server_timeout_ms=", absl::ToInt64Milliseconds(o.server_timeout))});
  if (coordinator.empty()) return absl::InternalError("the coordinator did not start");
  // Both jobs' copies (state, copies and slack), spread over the servers.
  const uint64_t budget_mib = o.num_params * 20 * 3 / kServers / (1 << 20) + 256;
  std::vector<testing::ServerProcess> servers;
  for (int i = 0; i < kServers; ++i) {
    servers.push_back(testing::StartServer(bin, dir, absl::StrCat("server-", i), coordinator,
                                           {absl::StrCat("--host_budget_mib=", budget_mib)},
                                           &daemons));
    if (servers.back().address.empty()) return absl::InternalError("a shard server did not start");
  }
  ASSIGN_OR_RETURN(Steps one,
                   Train(o, coordinator, "replicas-1", 1, o.steps + 1, 0, nullptr, &daemons));
  // Two copies: o.steps timed steps, then a server killed, then as many again.
  const int kill_before = o.steps + 2;
  ASSIGN_OR_RETURN(Steps two, Train(o, coordinator, "replicas-2", 2, 2 * o.steps + 2, kill_before,
                                    &servers[1], &daemons));
  std::vector<double> before_kill(
      two.seconds.begin(), two.seconds.begin() + std::min<size_t>(o.steps, two.seconds.size()));
  bool each_once = true;
  for (size_t i = 0; i < two.completed.size(); ++i) {
    each_once = each_once && two.completed[i] == static_cast<int64_t>(i + 1);
  }
  const double timeout_s = absl::ToDoubleSeconds(o.server_timeout);
  const double step_1 = Median(one.seconds), step_2 = Median(before_kill);
  return json{{"bench", "failover"},
              {"params", o.num_params},
              {"servers", kServers},
              {"workers", kWorkers},
              {"dtype", "bf16"},
              {"step_s_replicas_1", step_1},
              {"step_s_replicas_2", step_2},
              {"replicas_2_over_1", step_2 / step_1},
              {"steps_lost", two.steps_lost},
              {"every_step_once", each_once},
              {"pause_s", two.pause_s},
              {"server_timeout_s", timeout_s},
              {"pause_bound_s", timeout_s + 1.0},
              {"pause_fraction_of_bound", two.pause_s / (timeout_s + 1.0)},
              {"reseed_s", nullptr}};
}

}  // namespace strata
