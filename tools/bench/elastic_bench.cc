#include "tools/bench/elastic_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/subprocess.h"
#include "strata/client.h"
#include "testing/local_cluster.h"
#include "tools/bench/bench_util.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr char kJob[] = "elastic-bench";
constexpr int64_t kSteps = 90;
constexpr int64_t kJoinAtStep = 10;
constexpr int64_t kLeaveAfterStep = 25;
constexpr int64_t kKillAtStep = 40;
constexpr int64_t kSecondJoinAtStep = 45;
constexpr int64_t kStopAtStep = 52;
constexpr int64_t kRestartAtStep = 70;
constexpr uint64_t kSamplesPerStep = 12;  // divisible by 1, 2 and 3 workers
constexpr absl::Duration kTimeout = absl::Seconds(300);

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

void Append(std::ofstream& log, json event) {
  event["unix_ms"] = NowMs();
  log << event.dump() << std::endl;
}

std::vector<json> ReadEvents(const std::string& path) {
  std::vector<json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_discarded()) events.push_back(std::move(event));
  }
  return events;
}

// The last step worker `log` completed (0 before any).
int64_t LastStep(const std::string& log) {
  int64_t step = 0;
  for (const json& e : ReadEvents(log)) {
    if (e["event"] == "step") step = e["step"].get<int64_t>();
  }
  return step;
}

// Unix ms of the first step event in `events` completed after `after_ms`
// (with `world_size` workers when it is positive); -1 if none.
int64_t FirstStepAfter(const std::vector<json>& events, int64_t after_ms, int world_size = 0) {
  for (const json& e : events) {
    if (e["event"] != "step" || e["unix_ms"].get<int64_t>() < after_ms) continue;
    if (world_size > 0 && e["world_size"].get<int>() != world_size) continue;
    return e["unix_ms"].get<int64_t>();
  }
  return -1;
}

// Unix ms of the last step event in `events` completed before `before_ms`; -1
// if none.
int64_t LastStepBefore(const std::vector<json>& events, int64_t before_ms) {
  int64_t last = -1;
  for (const json& e : events) {
    if (e["event"] == "step" && e["unix_ms"].get<int64_t>() < before_ms) {
      last = e["unix_ms"].get<int64_t>();
    }
  }
  return last;
}

int64_t EventMs(const std::vector<json>& events, const std::string& name) {
  for (const json& e : events) {
    if (e["event"] == name) return e["unix_ms"].get<int64_t>();
  }
  return -1;
}

absl::StatusOr<pid_t> SpawnWorker(const std::string& coordinator, const std::string& id,
                                  uint64_t num_params, int64_t leave_after_step,
                                  const std::string& log) {
  std::vector<std::string> args = {"/proc/self/exe",
                                   "elastic-worker",
                                   coordinator,
                                   kJob,
                                   id,
                                   absl::StrCat(num_params),
                                   absl::StrCat(kSteps),
                                   absl::StrCat(leave_after_step),
                                   log};
  return SpawnProcess(args);
}

// Waits until `done()` or the time-out; false on time-out.
bool WaitFor(const std::function<bool()>& done) {
  absl::Time deadline = absl::Now() + kTimeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

}  // namespace

int RunElasticWorker(const std::vector<std::string>& args) {
  uint64_t num_params = 0;
  int64_t steps = 0, leave_after_step = 0;
  if (args.size() != 8 || !absl::SimpleAtoi(args[4], &num_params) ||
      !absl::SimpleAtoi(args[5], &steps) || !absl::SimpleAtoi(args[6], &leave_after_step)) {
    std::fprintf(stderr, "strata-bench elastic-worker: bad arguments\n");
    return 2;
  }
  std::ofstream log(args[7], std::ios::app);
  ClientOptions options;
  options.coordinator_address = args[1];
  options.job_id = args[2];
  options.worker_id = args[3];
  options.job.tensors = {{"flat", {static_cast<int64_t>(num_params)}}};
  options.job.world_size = 2;
  options.job.samples_per_step = kSamplesPerStep;
  options.job.chunk_num_params = uint64_t{1} << 20;
  options.loss_scale.dynamic = false;
  options.loss_scale.initial_scale = 1.0f;
  options.collective_timeout = absl::Seconds(30);
  Append(log, {{"event", "join"}});
  auto client = Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "elastic-worker %s: %s\n", args[3].c_str(),
                 client.status().ToString().c_str());
    return 1;
  }
  ReformStats formed = (*client)->last_reform();
  Append(log, {{"event", "connected"},
               {"reform_s", formed.seconds},
               {"param_pull_s", formed.param_pull_seconds}});
  std::vector<float> grads(num_params, 1e-3f);
  GradientFn compute = [&](const MicroBatch&, Client& c) { return c.AccumulateGradients(grads); };
  while ((*client)->step() < steps) {
    if ((*client)->step() + 1 == leave_after_step) (*client)->AnnounceLeave();
    absl::StatusOr<StepResult> result = (*client)->Step(compute);
    if (!result.ok()) {
      std::fprintf(stderr, "elastic-worker %s: %s\n", args[3].c_str(),
                   result.status().ToString().c_str());
      return 1;
    }
    Append(log, {{"event", "step"},
                 {"step", result->step},
                 {"world_size", result->world_size},
                 {"generation", result->generation},
                 {"attempts", result->attempts}});
    if (result->step == leave_after_step) {
      Append(log, {{"event", "leave"}});
      return (*client)->Leave().ok() ? 0 : 1;
    }
  }
  return 0;
}

namespace {

// When the scenario's changes happened (ms since the epoch; restart_s
// how long the restart took).
struct ScenarioTimes {
  int64_t kill_ms = -1, stop_ms = -1, restart_ms = -1;
  double restart_s = -1;
};

// The scenario: workers a and b train; c joins and is SIGKILLed; b leaves;
// d joins and is stopped past its lease (then killed); server 0 restarts;
// a trains to kSteps. Each worker logs its events to log_of(id).
absl::StatusOr<ScenarioTimes> RunScenario(
    LocalCluster& cluster, uint64_t num_params,
    const std::function<std::string(const std::string&)>& log_of, const std::string& dir) {
  ScenarioTimes times;
  // A worker's pid, or -1 (and `spawned` says why) when it could not start.
  absl::Status spawned;
  auto spawn = [&](const std::string& id, int64_t leave_after_step) -> pid_t {
    absl::StatusOr<pid_t> pid =
        SpawnWorker(cluster.coordinator_address(), id, num_params, leave_after_step, log_of(id));
    spawned.Update(pid.status());
    return pid.ok() ? *pid : -1;
  };
  pid_t a = spawn("a", 0);
  pid_t b = spawn("b", kLeaveAfterStep);
  pid_t c = -1, d = -1;
  bool ok = spawned.ok() && WaitFor([&] { return LastStep(log_of("a")) >= kJoinAtStep; });
  if (ok) {
    c = spawn("c", 0);
    ok = c > 0 && WaitFor([&] { return LastStep(log_of("a")) >= kKillAtStep; });
  }
  if (ok) {
    kill(c, SIGKILL);
    times.kill_ms = NowMs();
    ok = WaitFor([&] { return LastStep(log_of("a")) >= kSecondJoinAtStep; });
  }
  if (ok) {
    d = spawn("d", 0);
    ok = d > 0 && WaitFor([&] { return LastStep(log_of("d")) >= kStopAtStep; });
  }
  if (ok) {
    kill(d, SIGSTOP);
    times.stop_ms = NowMs();
    ok = WaitFor([&] { return LastStep(log_of("a")) >= kRestartAtStep; });
    kill(d, SIGKILL);  // a stopped client would hold the restart's shutdown
  }
  absl::Status restarted;
  if (ok) {
    times.restart_ms = NowMs();
    restarted = cluster.RestartServer(0);
    times.restart_s = (NowMs() - times.restart_ms) / 1e3;
    ok = restarted.ok() && WaitFor([&] { return LastStep(log_of("a")) >= kSteps; });
  }
  if (d > 0) kill(d, SIGKILL);
  for (pid_t pid : {a, b, c, d}) {
    if (pid <= 0) continue;
    if (!ok) kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  if (!spawned.ok()) return spawned;
  if (!restarted.ok()) return restarted;
  if (!ok) {
    return absl::DeadlineExceededError(
        absl::StrCat("the elastic job did not reach step ", kSteps, "; worker logs are in ", dir));
  }
  return times;
}

// The figures of a scenario run at `times`, from the workers' event logs.
json Figures(const ElasticBenchOptions& o, const ScenarioTimes& times,
             const std::function<std::string(const std::string&)>& log_of) {
  std::vector<json> ea = ReadEvents(log_of("a")), eb = ReadEvents(log_of("b")),
                    ec = ReadEvents(log_of("c"));
  std::vector<double> gaps;
  int64_t previous = -1;
  for (const json& e : ea) {
    if (e["event"] != "step") continue;
    int64_t t = e["unix_ms"].get<int64_t>();
    if (previous >= 0) gaps.push_back((t - previous) / 1e3);
    previous = t;
  }
  auto seconds = [](int64_t from, int64_t to) {
    return from < 0 || to < 0 ? -1.0 : (to - from) / 1e3;
  };
  const double lease_s = absl::ToDoubleSeconds(o.lease);
  const double step_s = Median(gaps);
  // From `change_ms` to worker a's first step in the generation it opened
  // (with `world_size` workers).
  auto pause = [&](int64_t change_ms, int world_size) {
    return seconds(change_ms, FirstStepAfter(ea, change_ms, world_size));
  };
  // The gap between worker a's steps at `from_ms` and `to_ms`, less an
  // ordinary step: what a change in between cost it.
  auto stalled = [&](int64_t from_ms, int64_t to_ms) {
    const double gap = seconds(from_ms, to_ms);
    return gap < 0 ? gap : std::max(0.0, gap - step_s);
  };
  // The stall worker a saw where a generation of `world_size` workers
  // formed after `after_ms`: up to its first step in it.
  auto stall = [&](int64_t after_ms, int world_size) {
    const int64_t first = FirstStepAfter(ea, after_ms, world_size);
    return stalled(LastStepBefore(ea, first), first);
  };
  double param_pull_s = -1;
  for (const json& e : ec) {
    if (e["event"] == "connected") param_pull_s = e["param_pull_s"].get<double>();
  }
  const double join_pause_s = stall(EventMs(ec, "join"), 3);
  const double leave_pause_s = stall(EventMs(eb, "leave"), 2);
  const double failure_pause_s = pause(times.kill_ms, 1);
  const double hang_pause_s = pause(times.stop_ms, 1);
  // What the restart cost worker a: from its last step before the restart
  // began to its first after it ended.
  const double restart_pause_s =
      stalled(LastStepBefore(ea, times.restart_ms + 1),
              FirstStepAfter(ea, times.restart_ms + static_cast<int64_t>(times.restart_s * 1e3)));
  return {{"bench", "elastic"},
          {"params", o.num_params},
          {"steps", kSteps},
          {"step_s", step_s},
          {"join_pause_s", join_pause_s},
          {"param_pull_s", param_pull_s},
          {"leave_pause_s", leave_pause_s},
          {"failure_pause_s", failure_pause_s},
          {"hang_pause_s", hang_pause_s},
          {"restart_pause_s", restart_pause_s},
          {"restart_s", times.restart_s},
          {"lease_s", lease_s},
          {"join_ok", join_pause_s >= 0 && join_pause_s <= 1 + param_pull_s},
          {"leave_ok", leave_pause_s >= 0 && leave_pause_s <= 1},
          {"failure_ok", failure_pause_s >= 0 && failure_pause_s <= 0.5},
          {"hang_ok", hang_pause_s >= 0 && hang_pause_s <= lease_s + 1},
          {"restart_ok", restart_pause_s >= 0 && restart_pause_s <= times.restart_s}};
}

}  // namespace

absl::StatusOr<json> BenchElastic(const ElasticBenchOptions& o) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = 2;
  cluster_options.host_budget_bytes = o.num_params * 16 + (uint64_t{64} << 20);
  cluster_options.worker_lease = o.lease;
  cluster_options.save_host_chunks = true;  // a clean restart keeps the chunks
  auto cluster = LocalCluster::Start(cluster_options);
  if (!cluster.ok()) return cluster.status();
  // The event logs outlive the cluster's directory when the job fails.
  std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("strata-elastic-bench-", getpid()))
          .string();
  std::filesystem::create_directories(dir);
  auto log_of = [&](const std::string& id) { return absl::StrCat(dir, "/", id, ".jsonl"); };
  absl::StatusOr<ScenarioTimes> times = RunScenario(**cluster, o.num_params, log_of, dir);
  if (!times.ok()) return times.status();
  json out = Figures(o, *times, log_of);
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace strata
