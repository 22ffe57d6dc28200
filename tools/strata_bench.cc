// strata-bench: benchmarks that measure their own limits in the same run and
// end with one JSON line. See --help.
#include <cstdio>

#include "absl/flags/flag.h"
#include "core/command_line.h"
#include "core/heap_retention.h"
#include "core/mutex_checks.h"
#include "kernels/isa.h"
#include "shard/shard_server.h"
#include "tools/bench/checkpoint_bench.h"
#include "tools/bench/elastic_bench.h"
#include "tools/bench/failover_bench.h"
#include "tools/bench/gpu_step_bench.h"
#include "tools/bench/gpu_worker_bench.h"
#include "tools/bench/kernel_bench.h"
#include "tools/bench/load_bench.h"
#include "tools/bench/nvme_step_bench.h"
#include "tools/bench/server_step_bench.h"
#include "tools/bench/step_bench.h"

ABSL_FLAG(uint64_t, params, 0,
          "parameters (a multiple of 64); 0: the command's default, 64 Mi (4 Mi for elastic)");
ABSL_FLAG(int, threads, 2,
          "adam, grad-stats, cast, server-step, gpu-step: kernel threads; nvme-step: the "
          "host-tier step's (--host_params)");
ABSL_FLAG(std::string, isa, "", "adam, grad-stats, cast: scalar, avx2 or avx512 (default: best)");
ABSL_FLAG(std::string, grad, "fp16",
          "adam, grad-stats, cast, server-step, gpu-step, nvme-step: fp16, bf16 or fp32 (cast and "
          "the steps: 16-bit)");
ABSL_FLAG(std::string, op, "to_float", "cast: to_float (16-bit -> fp32) or from_float");
ABSL_FLAG(
    std::string, state, "fp32",
    "adam, nvme-step, gpu-step: the optimizer state's precision, fp32 (m, v FP32) or int8 (m, v "
    "8-bit codes with a scale per 256 parameters; nvme-step then steps FP32 states too)");
ABSL_FLAG(int, grad_binades, 0,
          "adam: gradients +/-1e-3 * 2^-k with k spread over this many binades, as a trained "
          "layer's (0: all 1e-3)");
ABSL_FLAG(std::string, coordinator, "",
          "step: the cluster at this HOST:PORT (--servers shard servers, each with room for the "
          "job) instead of a loopback one; the workers run here");
ABSL_FLAG(std::string, iperf3_server, "",
          "step: HOST:PORT of a running `iperf3 -s` (on a shard server's host): the link's "
          "limit (default: loopback's)");
ABSL_FLAG(int, reps, 5, "adam, grad-stats, cast: timed repetitions (median reported)");
ABSL_FLAG(int, workers, 2, "step: workers (threads with their own client and Gloo pairs)");
ABSL_FLAG(int, servers, 2,
          "step, checkpoint: shard servers (in this process, on loopback; step with "
          "--coordinator: that cluster's)");
ABSL_FLAG(int, executor_threads, 1,
          "step, checkpoint, gpu-worker: optimizer threads per shard server");
ABSL_FLAG(
    uint64_t, checkpoint_buffer_mib, 384,
    "checkpoint: host memory per shard server kept for the states checkpoints keep aside (the "
    "server's --checkpoint_buffer_mib)");
ABSL_FLAG(uint64_t, checkpoint_memory_limit_mib,
          strata::ShardServerOptions::kDefaultCheckpointMemoryLimitBytes >> 20,
          "checkpoint: the most host memory per shard server for the states checkpoints keep "
          "aside (the server's --checkpoint_memory_limit_mib)");
ABSL_FLAG(std::string, dtype, "fp16", "step, gpu-worker: fp16 or bf16");
ABSL_FLAG(int, steps, 5, "step, failover, gpu-worker: timed steps (after warm-up steps)");
ABSL_FLAG(int64_t, server_timeout_ms, 1000, "failover: the coordinator's --server_timeout_ms");
ABSL_FLAG(uint64_t, host_prefault_mib, 0,
          "failover, checkpoint: each shard server's --host_prefault_mib (host memory faulted "
          "in at start-up for the chunks to come; checkpoint: at most the host_budget_mib its "
          "JSON reports)");
ABSL_FLAG(std::string, tls_dir, "",
          "step: also time the steps with TLS on every channel (a test CA and certificates "
          "made in this directory with openssl), reporting tls_step_over_plaintext");
ABSL_FLAG(std::string, dir, "",
          "nvme-step: directory for the NVMe tier's file and fio's; checkpoint: for the "
          "checkpoint and fio's file");
ABSL_FLAG(uint32_t, queue_depth, 32, "nvme-step: io_uring (and fio) queue depth");
ABSL_FLAG(uint64_t, io_bytes, uint64_t{1} << 20, "nvme-step: bytes per I/O (and fio's block size)");
ABSL_FLAG(int, nvme_executor_threads, strata::ShardServerOptions::kDefaultNvmeExecutorThreads,
          "nvme-step: threads that step the NVMe-resident chunks, as a shard server's flag of "
          "the name (its default)");
ABSL_FLAG(uint64_t, host_params, 0,
          "nvme-step: also time a step over this many host-tier parameters, alone and beside "
          "the NVMe steps");
ABSL_FLAG(int64_t, lease_ms, 1000, "elastic: the coordinator's worker lease");
ABSL_FLAG(int, clients, 200, "load: concurrent clients");
ABSL_FLAG(int, seconds, 60, "load: how long the clients run");
ABSL_FLAG(bool, json, false, "print only the JSON line");

namespace {

constexpr char kUsage[] =
    "strata-bench: benchmarks; each measures its limit in the same run and prints\n"
    "one JSON object as its last line.\n\n"
    "  strata-bench adam --params N --threads T [--isa scalar|avx2|avx512] [--state fp32|int8]\n"
    "                    [--grad fp16|bf16|fp32] [--grad_binades K] [--json]\n"
    "      fused AdamW over N parameters in 4 Mi chunks, against a memory probe\n"
    "      with the kernel's streams (read p m v g, write p m v and the copy);\n"
    "      gradients 1e-3, or with K spread over K binades as a trained layer's\n"
    "  strata-bench grad-stats --params N --threads T [--isa ...] [--grad ...]\n"
    "      sum of squares + finite flag, against a read probe\n"
    "  strata-bench cast --params N --threads T [--op to_float|from_float] [--grad fp16|bf16]\n"
    "      16-bit <-> fp32 casts, against a read+write probe\n"
    "  strata-bench server-step --params N --threads T [--grad fp16|bf16]\n"
    "      a shard server's staging and apply over host-tier chunks (no network),\n"
    "      against the AdamW kernel alone in the same run\n"
    "  strata-bench gpu-step --params N --threads T [--grad fp16|bf16] [--state fp32|int8]\n"
    "      the same over chunks in a GPU tier (AdamW on the GPU), against the copies\n"
    "      to and from the GPU it needs and beside the host-tier step, in the same run\n"
    "  strata-bench gpu-worker --params N [--servers S] [--executor_threads T] [--dtype ...]\n"
    "      one worker's whole step (gradients in, Step, CopyParams) with its buffers on\n"
    "      GPU 0 (NCCL in place) and with them in host memory (Gloo), servers in host\n"
    "      memory on loopback, against one fused AdamW with its states on the GPU\n"
    "  strata-bench nvme-step --params N --dir DIR [--queue_depth Q] [--io_bytes B]\n"
    "                    [--nvme_executor_threads E] [--host_params M] [--state fp32|int8]\n"
    "      the same over NVMe-resident chunks (read p m v, apply, write back),\n"
    "      against fio (io_uring, O_DIRECT) on DIR with the same I/O size and depth,\n"
    "      reading and writing at once (the bytes a step moves from the tier's counters),\n"
    "      and reading alone and writing alone (fraction_of_solo_bound: neither faster);\n"
    "      with M, also a host-tier step over M parameters, alone and beside it;\n"
    "      with int8 states, also the FP32 states' step, alternating with theirs\n"
    "      (speedup_over_fp32)\n"
    "  strata-bench step --params N --workers W --servers S [--dtype fp16|bf16] [--tls_dir D]\n"
    "      [--coordinator HOST:PORT --iperf3_server HOST:PORT]\n"
    "      the whole optimizer path of a step on loopback, against iperf3; and the\n"
    "      RPC layer alone (rpc_GBps: a step's pushes and pulls again, no apply,\n"
    "      over open connections: the median of 5);\n"
    "      with --tls_dir the same over TLS, and a plaintext and a TLS cluster\n"
    "      taking turns (tls_step_over_plaintext: the median of each TLS turn's step\n"
    "      over the plaintext turn's before it), against each plaintext turn's CPU\n"
    "      (the machine's busy time) plus AES-GCM of every byte (one core's rate,\n"
    "      measured) over all cores; with\n"
    "      --coordinator on that cluster's servers (other hosts), against iperf3 to\n"
    "      --iperf3_server\n"
    "  strata-bench checkpoint --params N --dir DIR [--servers S] [--checkpoint_buffer_mib M]\n"
    "      [--checkpoint_memory_limit_mib L] [--host_prefault_mib M]\n"
    "      saves a checkpoint of a training job (host-tier chunks) into DIR while it\n"
    "      trains, again two steps later and once it stopped (idle_save_*), and\n"
    "      restores a new job from it, against fio's direct write of new files (as\n"
    "      a save's) and read on DIR (the best of 4 runs; a rewrite of those files\n"
    "      beside it); reports the training pause each save caused and the memory\n"
    "      saves had to fault in themselves (allocated_during_saves_MiB)\n"
    "  strata-bench elastic [--params N (default 4 Mi)] [--lease_ms MS]\n"
    "      worker processes train an elastic job; one joins, one leaves, one is\n"
    "      killed, one is stopped: the pauses each change causes, against the targets\n"
    "      (strata-bench elastic-worker is those workers; not run by hand)\n"
    "  strata-bench failover [--params N (default 16 Mi)] [--steps S] [--server_timeout_ms MS]\n"
    "                        [--host_prefault_mib M]\n"
    "      a coordinator and 3 shard server processes; a job of one copy per chunk\n"
    "      and one of two train in turns, S turns of 2 steps (replicas_2_over_1: the\n"
    "      median of each turn's step over the other job's before it; target <= 1.25),\n"
    "      against its floor here (replicas_2_floor_over_1: the one-copy step's CPU,\n"
    "      the machine's busy time, plus one more AdamW pass, over all cores);\n"
    "      then 2 workers train a job of one copy while server 0 is drained 3 times\n"
    "      (rebalanced back in between; the drain of median rate reported:\n"
    "      drain_s, its GB/s against iperf3's loopback TCP while it moves\n"
    "      state: not the wait for a step\n"
    "      boundary, drain_boundary_wait_s; the copies built while training, the\n"
    "      pause; each drain's fraction of TCP; the longest step meanwhile\n"
    "      against a step); then, with no worker left, a\n"
    "      rebalance back onto it: idle_rebalance_*, the move's own rate), then\n"
    "      one of two copies (replicas_2_over_1_separate_jobs: the two jobs' median\n"
    "      steps), and one server is SIGKILLed: steps lost (target 0), the pause against the\n"
    "      server timeout (the detection) plus 1 s, and reseed_s until every\n"
    "      chunk has 2 copies";

uint64_t NumParams() {
  uint64_t n = absl::GetFlag(FLAGS_params);
  return n != 0 ? n : uint64_t{64} << 20;
}

absl::StatusOr<strata::DType> ParseDType(const std::string& name) {
  if (name == "fp16") return strata::DType::kFp16;
  if (name == "bf16") return strata::DType::kBf16;
  if (name == "fp32") return strata::DType::kFp32;
  return absl::InvalidArgumentError("dtype must be fp16, bf16 or fp32, not " + name);
}

// The benches of one process's kernels and tiers: adam, grad-stats, cast,
// server-step, gpu-step, nvme-step.
absl::StatusOr<nlohmann::json> RunKernelBench(const std::string& command) {
  strata::KernelBenchOptions o;
  o.num_params = NumParams();
  o.threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<strata::DType> grad = ParseDType(absl::GetFlag(FLAGS_grad));
  if (!grad.ok()) return grad.status();
  o.grad_dtype = *grad;
  o.reps = absl::GetFlag(FLAGS_reps);
  o.cast_op = absl::GetFlag(FLAGS_op);
  o.state = absl::GetFlag(FLAGS_state);
  o.grad_binades = absl::GetFlag(FLAGS_grad_binades);
  if (o.grad_binades < 0) return absl::InvalidArgumentError("--grad_binades must be >= 0");
  if (command == "adam") return strata::BenchAdam(o);
  if (command == "grad-stats") return strata::BenchGradStats(o);
  if (command == "cast") return strata::BenchCast(o);
  if (command == "server-step") return strata::BenchServerStep(o);
  if (command == "gpu-step") return strata::BenchGpuStep(o);
  if (command == "nvme-step") {
    return strata::BenchNvmeStep(
        o, strata::NvmeBenchOptions{absl::GetFlag(FLAGS_dir), absl::GetFlag(FLAGS_queue_depth),
                                    absl::GetFlag(FLAGS_io_bytes),
                                    absl::GetFlag(FLAGS_nvme_executor_threads),
                                    absl::GetFlag(FLAGS_host_params)});
  }
  return absl::InvalidArgumentError("unknown command '" + command + "'");
}

// The step bench's options from the flags.
absl::StatusOr<strata::StepBenchOptions> StepOptions() {
  strata::StepBenchOptions o;
  o.num_params = NumParams();
  o.workers = absl::GetFlag(FLAGS_workers);
  o.servers = absl::GetFlag(FLAGS_servers);
  o.executor_threads = absl::GetFlag(FLAGS_executor_threads);
  absl::StatusOr<strata::DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  o.dtype = *dtype;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.quiet = absl::GetFlag(FLAGS_json);
  o.tls_dir = absl::GetFlag(FLAGS_tls_dir);
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.iperf3_server = absl::GetFlag(FLAGS_iperf3_server);
  return o;
}

absl::StatusOr<nlohmann::json> Run(const std::string& command) {
  if (!absl::GetFlag(FLAGS_isa).empty()) {
    absl::StatusOr<strata::Isa> isa = strata::ParseIsa(absl::GetFlag(FLAGS_isa));
    if (!isa.ok()) return isa.status();
    if (absl::Status s = strata::SetActiveIsa(*isa); !s.ok()) return s;
  }
  if (command == "elastic") {
    strata::ElasticBenchOptions o;
    if (absl::GetFlag(FLAGS_params) != 0) o.num_params = absl::GetFlag(FLAGS_params);
    o.lease = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ms));
    return strata::BenchElastic(o);
  }
  if (command == "failover") {
    strata::FailoverBenchOptions o;
    if (absl::GetFlag(FLAGS_params) != 0) o.num_params = absl::GetFlag(FLAGS_params);
    if (absl::GetFlag(FLAGS_steps) > 0) o.steps = absl::GetFlag(FLAGS_steps);
    o.server_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_server_timeout_ms));
    o.host_prefault_mib = absl::GetFlag(FLAGS_host_prefault_mib);
    return strata::BenchFailover(o);
  }
  if (command == "load") {
    strata::LoadBenchOptions o;
    o.clients = absl::GetFlag(FLAGS_clients);
    o.duration = absl::Seconds(absl::GetFlag(FLAGS_seconds));
    return strata::BenchLoad(o);
  }
  if (command == "checkpoint") {
    strata::CheckpointBenchOptions o;
    o.num_params = NumParams();
    o.dir = absl::GetFlag(FLAGS_dir);
    o.servers = absl::GetFlag(FLAGS_servers);
    o.executor_threads = absl::GetFlag(FLAGS_executor_threads);
    o.checkpoint_buffer_bytes = absl::GetFlag(FLAGS_checkpoint_buffer_mib) << 20;
    o.checkpoint_memory_limit_bytes = absl::GetFlag(FLAGS_checkpoint_memory_limit_mib) << 20;
    o.host_prefault_bytes = absl::GetFlag(FLAGS_host_prefault_mib) << 20;
    return strata::BenchCheckpoint(o);
  }
  if (command == "gpu-worker") {
    strata::GpuWorkerBenchOptions o;
    if (absl::GetFlag(FLAGS_params) != 0) o.num_params = absl::GetFlag(FLAGS_params);
    o.servers = absl::GetFlag(FLAGS_servers);
    o.executor_threads = absl::GetFlag(FLAGS_executor_threads);
    absl::StatusOr<strata::DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return dtype.status();
    o.dtype = *dtype;
    if (absl::GetFlag(FLAGS_steps) > 0) o.steps = absl::GetFlag(FLAGS_steps);
    return strata::BenchGpuWorker(o);
  }
  if (command == "step") {
    absl::StatusOr<strata::StepBenchOptions> o = StepOptions();
    if (!o.ok()) return o.status();
    return strata::BenchStep(*o);
  }
  return RunKernelBench(command);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args = strata::InitCommandLine(argc, argv, kUsage);
  strata::ConfigureMutexDeadlockChecks();
  // As the shard servers and strata.launch's workers keep theirs.
  strata::RetainFreedHeapMemory();
  if (!args.empty() && args[0] == "elastic-worker") return strata::RunElasticWorker(args);
  if (args.size() != 1) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  absl::StatusOr<nlohmann::json> result = Run(args[0]);
  if (!result.ok()) {
    std::fprintf(stderr, "strata-bench %s: %s\n", args[0].c_str(),
                 result.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", result->dump().c_str());
  return 0;
}
