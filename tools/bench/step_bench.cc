#include "tools/bench/step_bench.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/shard_transport.h"
#include "core/status_macros.h"
#include "strata/client.h"
#include "testing/local_cluster.h"
#include "testing/test_certificates.h"
#include "tools/bench/alternating_jobs.h"
#include "tools/bench/apply_probe.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/crypto_probe.h"
#include "tools/bench/iperf.h"
#include "tools/bench/process_cpu.h"

namespace strata {
namespace {

using nlohmann::json;

// What rank 0 saw of the timed steps of one cluster, and the RPC layer's
// time for a step's transfers alone (0 where not measured).
struct StepRun {
  std::vector<double> step_seconds;
  std::vector<StepResult> results;
  double rpc_seconds = 0;
  // CPU time of the whole process (workers and in-process cluster) per
  // timed step.
  double cpu_seconds_per_step = 0;
};

// The RPC layer alone, on the cluster at `coordinator` after `options`'s job
// applied `step`: as many threads as workers each push and pull their slice
// of that step again, as a step's transfers go; the median of kRpcReps
// after one untimed. The servers answer the pushes as retries (no apply)
// and the pulls from the copy they hold.
constexpr int kRpcReps = 5;
absl::StatusOr<double> MeasureRpcSeconds(const std::string& coordinator,
                                         const ClientOptions& options, const TlsFiles& tls,
                                         int64_t step) {
  ASSIGN_OR_RETURN(FlatLayout layout,
                   FlatLayout::Create(options.job.tensors, options.job.chunk_num_params));
  ASSIGN_OR_RETURN(ChannelCredentials credentials, MakeChannelCredentials(tls, ""));
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator, credentials));
  v1::GetJobRequest get;
  get.set_job_id(options.job_id);
  v1::JobInfo job;
  RETURN_IF_ERROR(
      CallUnary(stub.get(), &v1::Coordinator::Stub::GetJob, get, &job, absl::Seconds(30)));
  const uint32_t workers = options.job.world_size;
  const size_t esize = DTypeSize(options.job.dtype);
  std::vector<uint8_t> grads(layout.PaddedNumParams(workers) * esize, 0);
  std::vector<uint8_t> params(grads.size());
  std::vector<std::unique_ptr<ShardTransport>> transports;
  std::vector<std::vector<Piece>> pieces;
  for (uint32_t w = 0; w < workers; ++w) {
    transports.push_back(
        std::make_unique<ShardTransport>(options.job_id, &layout, options.job.dtype, tls));
    RETURN_IF_ERROR(transports.back()->SetPlacement(job));
    pieces.push_back(
        transports.back()->PiecesOf(layout.WorkerSlice(w, workers), kMaxPayloadBytes / esize));
  }
  PushScalars scalars{1.0f, {}, std::nullopt};
  // Every worker's transfers at once; their seconds.
  auto transfer_all = [&]() -> absl::StatusOr<double> {
    std::vector<absl::Status> errors(workers);
    absl::Time started = absl::Now();
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        StepTransfer transfer;
        transfer.step = step;
        transfer.generation = std::numeric_limits<uint32_t>::max();  // not older than the job's
        transfer.pieces = &pieces[w];
        transfer.push = &scalars;
        transfer.grads = grads.data();
        transfer.params = params.data();
        transfer.window_bytes = uint64_t{128} << 20;
        transfer.timeout = absl::Seconds(120);
        errors[w] = transports[w]->PushPull(transfer);
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
    for (const absl::Status& e : errors) RETURN_IF_ERROR(e);
    return seconds;
  };
  // As the steps' transfers go: over connections already open, their
  // HTTP/2 windows grown (the first transfer is not timed).
  RETURN_IF_ERROR(transfer_all().status());
  std::vector<double> seconds;
  for (int rep = 0; rep < kRpcReps; ++rep) {
    ASSIGN_OR_RETURN(const double s, transfer_all());
    seconds.push_back(s);
  }
  return Median(seconds);
}

// A loopback cluster of o.servers servers with `tls` (none: plaintext).
absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(const StepBenchOptions& o,
                                                           const TlsFiles& tls) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = o.servers;
  cluster_options.host_budget_bytes = o.num_params * 16 / o.servers + (uint64_t{256} << 20);
  cluster_options.executor_threads = o.executor_threads;
  cluster_options.coordinator_tls = tls;
  cluster_options.server_tls = tls;
  return LocalCluster::Start(cluster_options);
}

// A worker's options for the bench's job on the cluster at `coordinator`
// (worker_id empty).
ClientOptions JobOptions(const StepBenchOptions& o, const std::string& coordinator,
                         const TlsFiles& tls) {
  ClientOptions options;
  options.coordinator_address = coordinator;
  options.tls_ca_file = tls.ca_file;
  options.job_id = "bench";
  options.job.tensors = {{"flat", {static_cast<int64_t>(o.num_params)}}};
  options.job.world_size = o.workers;
  options.job.dtype = o.dtype;
  options.loss_scale.dynamic = false;
  options.loss_scale.initial_scale = 1.0f;
  return options;
}

// Runs o.steps timed steps (after one warm-up) of a job of o.num_params on a
// fresh loopback cluster of o.servers servers with `tls` (none: plaintext),
// or on the cluster at o.coordinator; then, with `measure_rpc`, the RPC
// layer alone.
absl::StatusOr<StepRun> RunSteps(const StepBenchOptions& o, const TlsFiles& tls,
                                 const std::string& label, bool measure_rpc) {
  const uint64_t n = o.num_params;
  std::unique_ptr<LocalCluster> cluster;
  std::string coordinator = o.coordinator;
  if (coordinator.empty()) {
    ASSIGN_OR_RETURN(cluster, StartCluster(o, tls));
    coordinator = cluster->coordinator_address();
  }
  const ClientOptions options = JobOptions(o, coordinator, tls);

  StepRun run;
  std::vector<absl::Status> errors(o.workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions mine = options;
      mine.worker_id = absl::StrCat("bench-", w);
      auto client = Client::Connect(mine);
      if (!client.ok()) {
        errors[w] = client.status();
        return;
      }
      std::vector<float> grads(n, 1e-3f);
      double cpu_started = 0;
      for (int s = 0; s <= o.steps; ++s) {
        if (s == 1 && w == 0) cpu_started = SelfCpuSeconds();
        errors[w] = (*client)->AccumulateGradients(grads);
        if (!errors[w].ok()) return;
        absl::Time started = absl::Now();
        auto result = (*client)->Step();
        if (!result.ok()) {
          errors[w] = result.status();
          return;
        }
        if (s == 0 || w != 0) continue;  // warm-up; rank 0 reports
        run.step_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - started));
        if (s == o.steps) run.cpu_seconds_per_step = (SelfCpuSeconds() - cpu_started) / s;
        run.results.push_back(*result);
        if (!o.quiet) {
          std::fprintf(stderr, "%s step %d: %.3f s (collective %.3f s, push+pull %.3f s)\n",
                       label.c_str(), s, run.step_seconds.back(), result->collective_seconds,
                       result->push_pull_seconds);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  if (measure_rpc) {
    ASSIGN_OR_RETURN(run.rpc_seconds,
                     MeasureRpcSeconds(coordinator, options, tls, run.results.back().step));
  }
  return run;
}

// A plaintext and a TLS cluster up at once, trained in turns
// (alternating_jobs.h: o.steps turns of two steps each, the plaintext job's
// first), with the machine's busy CPU time of each timed step.
absl::StatusOr<AlternatingSteps> AlternateWithTls(const StepBenchOptions& o, const TlsFiles& tls) {
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> plaintext, StartCluster(o, TlsFiles{}));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> secure, StartCluster(o, tls));
  std::array<ClientOptions, 2> jobs = {JobOptions(o, plaintext->coordinator_address(), TlsFiles{}),
                                       JobOptions(o, secure->coordinator_address(), tls)};
  for (ClientOptions& job : jobs) job.job.samples_per_step = o.workers;
  const std::vector<float> grads(o.num_params, 1e-3f);
  return TrainAlternately(jobs, grads, o.workers, o.steps, /*steps_per_turn=*/2,
                          MachineBusySeconds);
}

}  // namespace

absl::StatusOr<json> BenchStep(const StepBenchOptions& o) {
  const uint64_t n = o.num_params;
  const DType dtype = o.dtype;
  if (!o.coordinator.empty() && !o.tls_dir.empty()) {
    return absl::InvalidArgumentError("--tls_dir needs the loopback cluster: no --coordinator");
  }
  // The link's best of a run before and one after the steps (bandwidth on
  // a shared machine varies from second to second).
  auto measure_link = [&] {
    return o.iperf3_server.empty() ? MeasureIperf3() : MeasureIperf3To(o.iperf3_server);
  };
  double iperf3 = measure_link();
  ASSIGN_OR_RETURN(const StepRun plaintext,
                   RunSteps(o, TlsFiles{}, "plaintext", /*measure_rpc=*/true));
  iperf3 = std::max(iperf3, measure_link());
  std::optional<StepRun> tls;
  AlternatingSteps tls_turns;
  if (!o.tls_dir.empty()) {
    testing::TestCertificates certificates(o.tls_dir);
    RETURN_IF_ERROR(certificates.Make());
    ASSIGN_OR_RETURN(tls, RunSteps(o, certificates.Files("server"), "tls", /*measure_rpc=*/false));
    ASSIGN_OR_RETURN(tls_turns, AlternateWithTls(o, certificates.Files("server")));
  }
  std::vector<double> collective, push_pull;
  for (const StepResult& r : plaintext.results) {
    collective.push_back(r.collective_seconds);
    push_pull.push_back(r.push_pull_seconds);
  }
  double push_pull_s = Median(push_pull);
  double wire_bytes = 2.0 * n * DTypeSize(dtype);  // every parameter up once and down once
  double apply_s = MeasureApplySeconds(n, dtype, o.servers * o.executor_threads);
  const double step_s = Median(plaintext.step_seconds);
  json out = {
      {"bench", "step"},
      {"cluster", o.coordinator.empty() ? std::string("loopback") : o.coordinator},
      {"link", o.iperf3_server.empty() ? std::string("loopback") : o.iperf3_server},
      {"params", n},
      {"workers", o.workers},
      {"servers", o.servers},
      {"dtype", DTypeName(dtype)},
      {"steps", o.steps},
      {"step_s", step_s},
      {"collective_s", Median(collective)},
      {"push_pull_s", push_pull_s},
      {"apply_s", apply_s},
      {"wire_GBps", wire_bytes / push_pull_s / 1e9},
      {"rpc_s", plaintext.rpc_seconds},
      {"rpc_GBps", wire_bytes / plaintext.rpc_seconds / 1e9},
      {"rpc_fraction_of_iperf3",
       iperf3 <= 0 ? json(nullptr) : json(wire_bytes / plaintext.rpc_seconds / 1e9 / iperf3)},
      {"iperf3_GBps", iperf3 < 0 ? json(nullptr) : json(iperf3)},
      {"wire_fraction_of_iperf3",
       iperf3 <= 0 ? json(nullptr) : json(wire_bytes / push_pull_s / 1e9 / iperf3)}};
  out["cpu_s_per_step"] = plaintext.cpu_seconds_per_step;
  if (tls.has_value()) {
    // The same steps over TLS (every channel, in the same run), and the
    // ratio from the alternating turns (the separate runs' medians compare
    // two moments of a machine whose speed drifts). A TLS step's floor: the
    // plaintext turn's CPU work (the machine's busy time: workers, servers,
    // the kernel's loopback work) plus the cryptography of every byte pushed
    // and pulled (sealed once, opened once), spread over every core -- or
    // the plaintext step, if longer.
    const double aes_GBps = MeasureAesGcmGBps(1.0);
    const double crypto_cpu_s = 2 * wire_bytes / (aes_GBps * 1e9);
    const std::vector<double> ratios = tls_turns.Ratios();
    const std::vector<double> floors = tls_turns.FloorRatios(crypto_cpu_s);
    const double tls_over_plaintext = Median(ratios);
    out["tls_step_s"] = Median(tls->step_seconds);
    out["tls_step_over_plaintext"] = tls_over_plaintext;
    out["tls_step_over_plaintext_each_turn"] = ratios;
    out["tls_step_over_plaintext_separate_runs"] = Median(tls->step_seconds) / step_s;
    out["aes_gcm_GBps_per_core"] = aes_GBps;
    out["tls_crypto_cpu_s"] = crypto_cpu_s;
    out["tls_added_cpu_s"] = Median(tls_turns.AddedCpuSeconds());
    out["tls_step_floor_over_plaintext"] = Median(floors);
    out["tls_step_fraction_of_floor"] = Median(floors) / tls_over_plaintext;
  }
  return out;
}

}  // namespace strata
