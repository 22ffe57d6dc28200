#include "tools/bench/failover_bench.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/coordinator_calls.h"
#include "testing/placement.h"
#include "testing/processes.h"
#include "tools/bench/alternating_jobs.h"
#include "tools/bench/apply_probe.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/iperf.h"
#include "tools/bench/process_cpu.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr int kServers = 3;
constexpr int kWorkers = 2;
// Drains of server 0 while a job trains: a move shares the cores with the
// job's steps, which come and go, so that one drain's rate is one sample of
// a wide spread (0.18-0.57 of loopback TCP for the same bytes within an hour).
constexpr int kDrains = 3;

// What rank 0 saw of a job's steps.
struct Steps {
  std::vector<double> seconds;  // each step's, the first's and the killed step's excluded
  // Each completed step's number, start and end.
  std::vector<int64_t> completed;
  std::vector<absl::Time> started, ended;
  double pause_s = 0;  // from the kill to the end of the next step completed
  int64_t steps_lost = 0;
};

// What happens to a job while it trains: before step `before_step` rank 0
// SIGKILLs `victim` (if set) and starts `during` (if set) on a thread of
// its own; the job trains on until `during` has returned.
struct Event {
  int before_step = 0;  // 0: nothing happens
  testing::ServerProcess* victim = nullptr;
  testing::Processes* daemons = nullptr;
  std::function<void()> during;
};

// Whether a job's workers go on past each step: the first worker to reach
// a step decides for all (so that none steps alone) -- on while below the
// job's steps or while its event's `during` runs. Thread-safe.
class StepsToGo {
 public:
  explicit StepsToGo(int64_t steps) : steps_(steps) {}
  bool After(int64_t step) {
    absl::MutexLock lock(&mu_);
    auto [it, first] = decided_.try_emplace(step, false);
    if (first) it->second = step < steps_ || during_running_;
    return it->second;
  }
  void DuringStarted() {
    absl::MutexLock lock(&mu_);
    during_running_ = true;
  }
  void DuringEnded() {
    absl::MutexLock lock(&mu_);
    during_running_ = false;
  }

 private:
  const int64_t steps_;
  absl::Mutex mu_;
  std::map<int64_t, bool> decided_ ABSL_GUARDED_BY(mu_);
  bool during_running_ ABSL_GUARDED_BY(mu_) = false;
};

// A worker's options for job `job_id` of `replicas` copies of one BF16
// tensor of o.num_params, with a fixed loss scale of 1 (worker_id empty).
ClientOptions JobClientOptions(const FailoverBenchOptions& o, const std::string& coordinator,
                               const std::string& job_id, uint32_t replicas) {
  ClientOptions options;
  options.coordinator_address = coordinator;
  options.job_id = job_id;
  options.job.tensors = {{"flat", {static_cast<int64_t>(o.num_params)}}};
  options.job.world_size = kWorkers;
  options.job.samples_per_step = kWorkers;
  options.job.dtype = DType::kBf16;
  options.job.replicas = replicas;
  options.loss_scale.dynamic = false;
  options.loss_scale.initial_scale = 1.0f;
  return options;
}

// Trains job `job_id` of `replicas` copies for `steps` steps (or more,
// until `event`'s `during` returns) with two worker threads, through
// `event`; then both leave the job.
absl::StatusOr<Steps> Train(const FailoverBenchOptions& o, const std::string& coordinator,
                            const std::string& job_id, uint32_t replicas, int steps,
                            const Event& event) {
  const ClientOptions options = JobClientOptions(o, coordinator, job_id, replicas);
  Steps out;
  absl::Mutex mu;
  std::vector<absl::Status> errors(kWorkers);
  std::thread during;
  StepsToGo to_go(steps);
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
      while (to_go.After((*client)->step())) {
        const bool now = (*client)->rank() == 0 && event.before_step > 0 &&
                         (*client)->step() + 1 == event.before_step;
        const bool kill_now = now && event.victim != nullptr;
        if (kill_now) {
          kill(event.victim->pid, SIGKILL);
          waitpid(event.victim->pid, nullptr, 0);
          event.daemons->Forget(event.victim->pid);
          killed_at = absl::Now();
        }
        if (now && event.during) {
          to_go.DuringStarted();
          during = std::thread([&] {
            event.during();
            to_go.DuringEnded();
          });
        }
        const absl::Time started = absl::Now();
        absl::StatusOr<StepResult> result = (*client)->Step(compute);
        if (!result.ok()) {
          errors[w] = result.status();
          return;
        }
        if ((*client)->rank() != 0) continue;
        const absl::Time ended = absl::Now();
        absl::MutexLock lock(&mu);
        out.completed.push_back(result->step);
        out.started.push_back(started);
        out.ended.push_back(ended);
        if (kill_now) {
          out.pause_s = absl::ToDoubleSeconds(ended - killed_at);
        } else if (result->step > 1) {  // the first pays for the connections
          out.seconds.push_back(absl::ToDoubleSeconds(ended - started));
        }
      }
      if ((*client)->rank() == 0) {
        absl::MutexLock lock(&mu);
        out.steps_lost = (*client)->last_reform().steps_lost;
      }
      // Gone from the job at once, not a lease later: the move that follows
      // the training finds no member to wait for.
      errors[w] = (*client)->Leave();
    });
  }
  for (auto& t : threads) t.join();
  if (during.joinable()) during.join();
  for (const absl::Status& e : errors) RETURN_IF_ERROR(e);
  return out;
}

// Whether the steps completed are 1, 2, ... each once.
bool EachOnce(const Steps& steps) {
  for (size_t i = 0; i < steps.completed.size(); ++i) {
    if (steps.completed[i] != static_cast<int64_t>(i + 1)) return false;
  }
  return true;
}

// The longest step that ran at some time in [from, to].
double LongestStepWithin(const Steps& steps, absl::Time from, absl::Time to) {
  double longest = 0;
  for (size_t i = 0; i < steps.completed.size(); ++i) {
    if (steps.ended[i] >= from && steps.started[i] <= to) {
      longest = std::max(longest, absl::ToDoubleSeconds(steps.ended[i] - steps.started[i]));
    }
  }
  return longest;
}

// Seconds from `since` until the placement of `job_id` satisfies `done`
// (polled every 10 ms for up to `limit`); negative when it does not.
double SecondsUntil(const std::string& coordinator, const std::string& job_id,
                    const std::function<bool(const v1::GetPlacementResponse&)>& done,
                    absl::Time since, absl::Duration limit) {
  while (absl::Now() < since + limit) {
    auto placement = testing::Placement(coordinator, job_id);
    if (placement.ok() && done(*placement)) return absl::ToDoubleSeconds(absl::Now() - since);
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

// Whether no copy of `placement` is on `server`.
bool NoneOn(const v1::GetPlacementResponse& placement, const std::string& server) {
  for (const v1::PlacementRow& row : placement.rows()) {
    if (row.server_address() == server) return false;
  }
  return true;
}

// A coordinator process and kServers shard servers in `dir`.
struct FailoverCluster {
  std::string coordinator;
  std::vector<testing::ServerProcess> servers;
};
absl::StatusOr<FailoverCluster> StartFailoverCluster(const FailoverBenchOptions& o,
                                                     const std::string& dir,
                                                     testing::Processes* daemons) {
  FailoverCluster cluster;
  const std::string bin = BinDir();
  cluster.coordinator = testing::StartCoordinator(
      bin, dir, daemons,
      {absl::StrCat("--server_timeout_ms=", absl::ToInt64Milliseconds(o.server_timeout))});
  if (cluster.coordinator.empty()) return absl::InternalError("the coordinator did not start");
  // Room on each server for a whole copy of the two-copy job (each survivor
  // holds every chunk once the lost server's copies are seeded again) and
  // half the one-copy job (the undrained servers' share), with slack.
  const uint64_t budget_mib = o.num_params * 20 * 2 / (1 << 20) + 256;
  // No job here saves a checkpoint: the servers keep no memory for saves,
  // which they would fault in beside the timed steps after each job is made
  // or moved (seconds on a VM whose first touch is slow), so that the step
  // times compare one copy with two, not which steps that work fell on.
  for (int i = 0; i < kServers; ++i) {
    cluster.servers.push_back(
        testing::StartServer(bin, dir, absl::StrCat("server-", i), cluster.coordinator,
                             {absl::StrCat("--host_budget_mib=", budget_mib),
                              absl::StrCat("--host_prefault_mib=", o.host_prefault_mib),
                              "--checkpoint_memory_limit_mib=0"},
                             daemons));
    if (cluster.servers.back().address.empty()) {
      return absl::InternalError("a shard server did not start");
    }
  }
  return cluster;
}

// A job of one copy and one of two trained in turns (alternating_jobs.h),
// o.steps turns of two steps each, then deleted; each timed step's CPU
// time is the machine's busy time (the workers', the daemons' and the
// kernel's work for them).
absl::StatusOr<AlternatingSteps> AlternatingCopies(const FailoverBenchOptions& o,
                                                   const std::string& coordinator) {
  const std::vector<float> grads(o.num_params, 1e-3f);
  ASSIGN_OR_RETURN(
      AlternatingSteps steps,
      TrainAlternately({JobClientOptions(o, coordinator, "alternating-1", 1),
                        JobClientOptions(o, coordinator, "alternating-2", 2)},
                       grads, kWorkers, o.steps, /*steps_per_turn=*/2, MachineBusySeconds));
  for (const char* job : {"alternating-1", "alternating-2"}) {
    v1::DeleteJobResponse deleted;
    RETURN_IF_ERROR(testing::DeleteJob(coordinator, job, &deleted));
  }
  return steps;
}

// Bytes per second of `moved`, in GB/s (0 for no time), over the time it
// moved state: not the wait for the workers to reach a step boundary.
double MovedGBps(const v1::CopiesMoved& moved) {
  const double seconds = moved.seconds() - moved.boundary_wait_seconds();
  return seconds > 0 ? moved.bytes() / seconds / 1e9 : 0;
}

// Calls off the drain of `server` and rebalances job "replicas-1" back
// onto it; the rebalance's answer in `rebalanced`.
absl::Status UndrainServer(const std::string& coordinator, const std::string& server,
                           v1::RebalanceJobResponse* rebalanced) {
  v1::DrainServerResponse undrained;
  RETURN_IF_ERROR(
      testing::DrainServer(coordinator, server, /*cancel=*/true, &undrained, absl::Seconds(30)));
  return testing::RebalanceJob(coordinator, "replicas-1", rebalanced, absl::Minutes(10));
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
  ASSIGN_OR_RETURN(FailoverCluster cluster, StartFailoverCluster(o, dir, &daemons));
  const std::string& coordinator = cluster.coordinator;
  std::vector<testing::ServerProcess>& servers = cluster.servers;
  // The price of the second copy (the jobs the events meet train one after
  // the other).
  ASSIGN_OR_RETURN(const AlternatingSteps alternating, AlternatingCopies(o, coordinator));
  const double apply_cpu_s = MeasureApplySeconds(o.num_params, DType::kBf16, /*threads=*/1);
  // One copy: o.steps timed steps, then server 0 drained kDrains times,
  // then as many again.
  const int event_before = o.steps + 2;
  const double tcp_GBps = MeasureIperf3();
  std::vector<v1::DrainServerResponse> drains(kDrains);
  absl::Status drain_status;
  absl::Time drain_started, drain_ended;
  // The drains share the cores with the job, and so does their bound's
  // second figure: loopback TCP measured while the job trains. Between two
  // drains the drain is called off and a rebalance moves copies back onto
  // server 0, the job training on.
  double tcp_training_GBps = -1;
  Event drain{event_before, nullptr, nullptr, [&] {
                tcp_training_GBps = MeasureIperf3();
                drain_started = absl::Now();
                for (int d = 0; d < kDrains && drain_status.ok(); ++d) {
                  v1::RebalanceJobResponse rebalanced;
                  if (d > 0) {
                    drain_status = UndrainServer(coordinator, servers[0].address, &rebalanced);
                  }
                  if (drain_status.ok()) {
                    drain_status =
                        testing::DrainServer(coordinator, servers[0].address,
                                             /*cancel=*/false, &drains[d], absl::Minutes(10));
                  }
                }
                drain_ended = absl::Now();
              }};
  ASSIGN_OR_RETURN(Steps one, Train(o, coordinator, "replicas-1", 1, 2 * o.steps + 2, drain));
  RETURN_IF_ERROR(drain_status);
  // The drain of median rate stands for them all.
  std::vector<double> drain_rates;
  for (const v1::DrainServerResponse& d : drains) drain_rates.push_back(MovedGBps(d.moved()));
  const v1::DrainServerResponse& drained =
      drains[std::find(drain_rates.begin(), drain_rates.end(), Median(drain_rates)) -
             drain_rates.begin()];
  // The same move with no job training (its workers are gone): the copies
  // spread back onto server 0 with the cores to themselves.
  v1::RebalanceJobResponse idle;
  RETURN_IF_ERROR(UndrainServer(coordinator, servers[0].address, &idle));
  // Two copies: o.steps timed steps, then a server killed, then as many
  // again, while the copies it held are seeded on the others.
  // The loss is detected when the victim's copies leave the placement.
  double detection_s = -1, reseed_s = -1;
  Event kill{
      event_before, &servers[1], &daemons, [&] {
        const std::string& victim = servers[1].address;
        const absl::Time killed = absl::Now();
        detection_s = SecondsUntil(
            coordinator, "replicas-2",
            [&](const v1::GetPlacementResponse& p) { return NoneOn(p, victim); }, killed,
            absl::Minutes(5));
        reseed_s = SecondsUntil(
            coordinator, "replicas-2",
            [&](const v1::GetPlacementResponse& p) { return testing::HasCopies(p, 2, victim); },
            killed, absl::Minutes(5));
      }};
  ASSIGN_OR_RETURN(Steps two, Train(o, coordinator, "replicas-2", 2, 2 * o.steps + 2, kill));
  const auto timed = [&](const Steps& steps) {
    return std::vector<double>(
        steps.seconds.begin(),
        steps.seconds.begin() + std::min<size_t>(o.steps, steps.seconds.size()));
  };
  const double timeout_s = absl::ToDoubleSeconds(o.server_timeout);
  const double step_1 = Median(timed(one)), step_2 = Median(timed(two));
  // The price of the second copy against the least it can be here: the
  // one-copy step's work and one more AdamW pass over every parameter
  // (apply_cpu_s, the kernel alone on one thread).
  const std::vector<double> ratios = alternating.Ratios();
  const std::vector<double> floors = alternating.FloorRatios(apply_cpu_s);
  const double drain_s = drained.moved().seconds();
  const double drain_GBps = MovedGBps(drained.moved());
  std::vector<double> drain_fractions_while_training;
  for (const double rate : drain_rates) {
    drain_fractions_while_training.push_back(tcp_training_GBps > 0 ? rate / tcp_training_GBps : -1);
  }
  return json{
      {"bench", "failover"},
      {"params", o.num_params},
      {"servers", kServers},
      {"workers", kWorkers},
      {"dtype", "bf16"},
      {"step_s_replicas_1", Median(alternating.seconds[0])},
      {"step_s_replicas_2", Median(alternating.seconds[1])},
      {"replicas_2_over_1", Median(ratios)},
      {"replicas_2_over_1_each_turn", ratios},
      {"replicas_2_over_1_separate_jobs", step_2 / step_1},
      {"cpu_s_replicas_1", Median(alternating.cpu_seconds[0])},
      {"cpu_s_replicas_2", Median(alternating.cpu_seconds[1])},
      {"replicas_2_over_1_cpu", Median(alternating.CpuRatios())},
      {"apply_cpu_s", apply_cpu_s},
      {"replicas_2_floor_over_1", Median(floors)},
      {"replicas_2_fraction_of_floor", Median(floors) / Median(ratios)},
      {"steps_lost", two.steps_lost},
      {"every_step_once", EachOnce(one) && EachOnce(two)},
      {"pause_s", two.pause_s},
      {"server_timeout_s", timeout_s},
      {"host_prefault_mib", o.host_prefault_mib},
      {"pause_bound_s", timeout_s + 1.0},
      {"pause_fraction_of_bound", two.pause_s / (timeout_s + 1.0)},
      {"detection_s", detection_s},
      {"pause_beyond_detection_s", two.pause_s - detection_s},
      {"reseed_s", reseed_s},
      {"drain_s", drain_s},
      {"drain_bytes", drained.moved().bytes()},
      {"drain_GBps", drain_GBps},
      {"drain_copies", drained.moved().copies()},
      {"drain_copies_built_while_training", drained.moved().prepared()},
      {"drain_copies_built_in_place", drained.moved().built_in_place()},
      {"drain_build_s", drained.moved().prepare_seconds()},
      {"drain_boundary_wait_s", drained.moved().boundary_wait_seconds()},
      {"drain_at_step_boundary", drained.moved().at_step_boundary() == drained.moved().jobs()},
      {"drain_paused_s", drained.moved().fenced_seconds()},
      {"drain_copy_s", drained.moved().copy_seconds()},
      {"drain_copy_GBps", drained.moved().copy_seconds() > 0
                              ? drained.moved().bytes() / drained.moved().copy_seconds() / 1e9
                              : 0},
      {"loopback_tcp_GBps", tcp_GBps},
      {"drain_fraction_of_loopback_tcp", tcp_GBps > 0 ? drain_GBps / tcp_GBps : -1},
      {"loopback_tcp_while_training_GBps", tcp_training_GBps},
      {"drain_fraction_of_loopback_tcp_while_training",
       tcp_training_GBps > 0 ? drain_GBps / tcp_training_GBps : -1},
      {"drains", kDrains},
      {"drain_fractions_of_loopback_tcp_while_training", drain_fractions_while_training},
      {"max_step_during_drain_s", LongestStepWithin(one, drain_started, drain_ended)},
      {"max_step_during_drain_over_step",
       LongestStepWithin(one, drain_started, drain_ended) / step_1},
      {"idle_rebalance_s", idle.moved().seconds()},
      {"idle_rebalance_bytes", idle.moved().bytes()},
      {"idle_rebalance_paused_s", idle.moved().fenced_seconds()},
      {"idle_rebalance_boundary_wait_s", idle.moved().boundary_wait_seconds()},
      {"idle_rebalance_fraction_of_loopback_tcp",
       tcp_GBps > 0 ? MovedGBps(idle.moved()) / tcp_GBps : -1}};
}

}  // namespace strata
