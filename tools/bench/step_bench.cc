#include "tools/bench/step_bench.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/adam.h"
#include "strata/client.h"
#include "testing/local_cluster.h"
#include "tools/bench/bench_util.h"

namespace strata {
namespace {

using nlohmann::json;

// Single-stream loopback TCP bandwidth in GB/s from iperf3, or a negative
// value when iperf3 is not installed or fails.
double MeasureIperf3() {
  int port = 20000 + static_cast<int>(std::random_device{}() % 20000);
  std::string server = absl::StrCat("iperf3 -s -1 -p ", port, " >/dev/null 2>&1 &");
  if (std::system(server.c_str()) != 0) return -1;
  absl::SleepFor(absl::Milliseconds(300));
  std::string client = absl::StrCat("iperf3 -c 127.0.0.1 -p ", port, " -t 2 -J 2>/dev/null");
  FILE* pipe = popen(client.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  if (pclose(pipe) != 0) return -1;
  json result = json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.contains("end")) return -1;
  return result["end"]["sum_received"]["bits_per_second"].get<double>() / 8e9;
}

// Time of the AdamW kernel over `num_params` (the servers' apply work),
// spread over `threads` threads as the servers' executors would.
double MeasureApplySeconds(uint64_t num_params, DType dtype, int threads) {
  std::vector<float> p(num_params, 0.5f), m(num_params, 0.0f), v(num_params, 0.0f);
  std::vector<uint16_t> g(num_params, 0x3c00), copy(num_params);
  AdamConstants c = MakeAdamConstants(AdamConfig{}, 1, 1.0f);
  absl::Time started = absl::Now();
  std::vector<std::thread> pool;
  uint64_t per = (num_params + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t begin = std::min(num_params, t * per), end = std::min(num_params, begin + per);
      AdamUpdate(c, dtype, g.data() + begin, p.data() + begin, m.data() + begin, v.data() + begin,
                 dtype, copy.data() + begin, end - begin);
    });
  }
  for (auto& t : pool) t.join();
  return absl::ToDoubleSeconds(absl::Now() - started);
}

}  // namespace

absl::StatusOr<json> BenchStep(const StepBenchOptions& o) {
  const uint64_t n = o.num_params;
  const int workers = o.workers;
  const int servers = o.servers;
  const int steps = o.steps;
  const DType dtype = o.dtype;
  const bool quiet = o.quiet;
  double iperf3 = MeasureIperf3();

  LocalClusterOptions cluster_options;
  cluster_options.num_servers = servers;
  cluster_options.host_budget_bytes = n * 16 / servers + (uint64_t{256} << 20);
  cluster_options.executor_threads = o.executor_threads;
  auto cluster = LocalCluster::Start(cluster_options);
  if (!cluster.ok()) return cluster.status();
  ClientOptions options;
  options.coordinator_address = (*cluster)->coordinator_address();
  options.job_id = "bench";
  options.tensors = {{"flat", {static_cast<int64_t>(n)}}};
  options.world_size = workers;
  options.dtype = dtype;
  options.loss_scale.dynamic = false;
  options.loss_scale.initial_scale = 1.0f;

  std::vector<std::vector<StepResult>> results(workers);
  std::vector<std::vector<double>> step_seconds(workers);
  std::vector<absl::Status> errors(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions mine = options;
      mine.worker_id = absl::StrCat("bench-", w);
      auto client = Client::Connect(mine);
      if (!client.ok()) {
        errors[w] = client.status();
        return;
      }
      std::vector<float> grads(n, 1e-3f);
      for (int s = 0; s <= steps; ++s) {
        errors[w] = (*client)->AccumulateGradients(grads);
        if (!errors[w].ok()) return;
        absl::Time started = absl::Now();
        auto result = (*client)->Step();
        if (!result.ok()) {
          errors[w] = result.status();
          return;
        }
        if (s == 0) continue;  // warm-up
        step_seconds[w].push_back(absl::ToDoubleSeconds(absl::Now() - started));
        results[w].push_back(*result);
        if (!quiet && w == 0) {
          std::fprintf(stderr, "step %d: %.3f s (collective %.3f s, push+pull %.3f s)\n", s,
                       step_seconds[w].back(), result->collective_seconds,
                       result->push_pull_seconds);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  std::vector<double> collective, push_pull;
  for (const StepResult& r : results[0]) {
    collective.push_back(r.collective_seconds);
    push_pull.push_back(r.push_pull_seconds);
  }
  double push_pull_s = Median(push_pull);
  double wire_bytes = 2.0 * n * DTypeSize(dtype);  // every parameter up once and down once
  double apply_s = MeasureApplySeconds(n, dtype, servers * cluster_options.executor_threads);
  json out = {{"bench", "step"},
              {"params", n},
              {"workers", workers},
              {"servers", servers},
              {"dtype", DTypeName(dtype)},
              {"steps", steps},
              {"step_s", Median(step_seconds[0])},
              {"collective_s", Median(collective)},
              {"push_pull_s", push_pull_s},
              {"apply_s", apply_s},
              {"wire_GBps", wire_bytes / push_pull_s / 1e9},
              {"iperf3_GBps", iperf3 < 0 ? json(nullptr) : json(iperf3)},
              {"wire_fraction_of_iperf3",
               iperf3 <= 0 ? json(nullptr) : json(wire_bytes / push_pull_s / 1e9 / iperf3)}};
  return out;
}

}  // namespace strata
