// strata-server: a shard server. See --help.
#include <csignal>

#include "absl/flags/flag.h"
#include "core/command_line.h"
#include "core/heap_retention.h"
#include "core/mutex_checks.h"
#include "core/signals.h"
#include "rpc/tls_ciphers.h"
#include "rpc/tls_flags.h"
#include "shard/shard_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7701", "host:port to serve on; port 0 picks a free port");
ABSL_FLAG(std::string, advertise, "",
          "HOST:PORT, or HOST with the bound port, announced to the coordinator (default: the "
          "listen host and bound port)");
ABSL_FLAG(std::string, zone, "",
          "failure domain (rack, host, power feed; letters, digits, '.', '_', '-'): a chunk's "
          "copies go to servers of distinct zones where the fleet allows (default: a zone of "
          "its own)");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:7700", "host:port of strata-coordinator");
ABSL_FLAG(std::string, data_dir, "/var/lib/strata/server",
          "directory for this server's RocksDB metadata");
ABSL_FLAG(std::string, checkpoint_root, "/var/lib/strata",
          "checkpoint directories the coordinator names (saves, restores) must resolve inside "
          "this directory, after '..' and symlinks; empty: the server takes no checkpoints");
ABSL_FLAG(int64_t, gpu_budget_mib, -1,
          "GPU-tier budget in MiB on --gpu_device: chunk states go there first and AdamW runs "
          "on the GPU; -1: 80% of the GPU's free memory at start-up where a GPU is found, no "
          "GPU tier where none is; 0: no GPU tier");
ABSL_FLAG(int, gpu_device, 0, "the GPU (CUDA device ordinal) of the GPU tier");
ABSL_FLAG(uint64_t, host_budget_mib, 1024,
          "host-tier budget in MiB; a job that does not fit is refused. A freed chunk's memory "
          "stays resident (and page-locked) within it for the next chunk of its size");
ABSL_FLAG(uint64_t, host_prefault_mib, 0,
          "host memory in MiB, at most --host_budget_mib, faulted in (and page-locked) at "
          "start-up and kept for chunks: new jobs, restores and moves of chunks onto this "
          "server then take memory faulted in already instead of faulting it in as they run "
          "(on a VM whose memory the host lends on first touch, several times slower). "
          "Resident from start-up whether used or not");
ABSL_FLAG(bool, pin_host_memory, true,
          "page-lock the host tier (mlock); needs a memlock limit (ulimit -l) above "
          "--host_budget_mib or CAP_IPC_LOCK");
ABSL_FLAG(std::string, nvme_dir, "",
          "directory for the NVMe tier's preallocated file (O_DIRECT, io_uring); empty: no "
          "NVMe tier. Chunks go to host memory first, then to NVMe");
ABSL_FLAG(
    uint64_t, nvme_budget_mib, 0,
    "NVMe-tier budget in MiB (a chunk there takes its state's size; each state size also keeps "
    "a spare slot per commit in flight, at most one per NVMe thread and one); 0: no NVMe "
    "tier");
ABSL_FLAG(uint32_t, nvme_queue_depth, 32, "io_uring queue depth of the NVMe tier");
ABSL_FLAG(bool, save_host_chunks, true,
          "at a clean shutdown (SIGTERM), save the chunk states held in host and GPU memory under "
          "--data_dir, so that a restart continues them (a crash loses them)");
ABSL_FLAG(int, executor_threads, 2, "threads that apply the optimizer to chunks");
ABSL_FLAG(int, nvme_executor_threads, strata::ShardServerOptions::kDefaultNvmeExecutorThreads,
          "threads that apply the optimizer to chunks whose state is on NVMe (each reads, "
          "applies and writes back one chunk at a time, so more threads than cores keep the "
          "disk busy; each takes a staging buffer of a chunk's state from the host budget; "
          "apart from --executor_threads, so that host-tier chunks never wait for the disk)");
ABSL_FLAG(uint64_t, checkpoint_buffer_mib, 384,
          "host memory in MiB kept (faulted in at start-up) for the chunk states that "
          "checkpoints keep aside while training goes on: the new state of each host-tier chunk "
          "that training updates before the save wrote it (until its next step), a copy for "
          "NVMe-tier chunks (the default holds 8 chunks of 4 Mi parameters). Beyond it, the memory "
          "each job's saves take (a state per host- or GPU-tier chunk) is faulted in when the "
          "job's chunks are "
          "allocated, so that saves do not fault memory in inside training steps, and kept "
          "while the job lives, up to --checkpoint_memory_limit_mib. Each save logs the most it "
          "used");
ABSL_FLAG(uint64_t, checkpoint_memory_limit_mib,
          strata::ShardServerOptions::kDefaultCheckpointMemoryLimitBytes >> 20,
          "the most host memory in MiB that the server holds for checkpoints to keep chunk "
          "states aside in (at least --checkpoint_buffer_mib; equal to it, nothing is faulted in "
          "ahead), and for new copies of chunks built here while their job trains (a drain, a "
          "rebalance, a lost copy restored) in GPU or NVMe chunks (a copy for a host-memory "
          "chunk is built in the chunk). Past it, a training step that finds a chunk's state "
          "not yet saved writes it to the checkpoint itself before updating the chunk: "
          "training waits for that write instead of the server running out of memory; a copy "
          "that finds no memory is copied whole once its job is fenced");
ABSL_FLAG(int, register_timeout_s, 30, "seconds to wait for the coordinator at start-up");
ABSL_FLAG(int64_t, storage_probe_ms, 1000,
          "how often --data_dir and --nvme_dir are probed with a synced write; while they fail "
          "(a full or broken disk) the server answers NOT_SERVING to health checks");
ABSL_FLAG(int64_t, max_pull_wait_ms, 600000,
          "the longest a pull waits for its chunk's next step before it is answered "
          "DEADLINE_EXCEEDED (its caller's deadline or cancellation may end it first)");
ABSL_FLAG(bool, auth, false,
          "authentication (needs TLS): control RPCs from the coordinator's certificate (CN "
          "strata-coordinator) only, a job's pushes, pulls and state from callers with its "
          "worker token only. Use with the coordinator's --auth_file");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks a free port; "
          "empty: no metrics endpoint");
ABSL_FLAG(std::string, ready_file, "",
          "when set, the bound host:port is written to this file once serving");

int main(int argc, char** argv) {
  strata::InitCommandLine(
      argc, argv,
      "strata-server: a shard server. Holds chunks of the FP32 master weights and Adam\n"
      "moments of jobs in its GPU tier (where a GPU is found), then its host tier, then\n"
      "its NVMe tier, applies AdamW as workers\n"
      "push gradients, and serves the updated low-precision parameters; also the gRPC\n"
      "health service and, with --metrics_listen, Prometheus metrics. Registers with\n"
      "the coordinator at start-up; stops cleanly on SIGINT/SIGTERM, saving the chunks\n"
      "held in host and GPU memory for its next start.\n\n"
      "  strata-server --coordinator=HOST:PORT --listen=HOST:PORT --data_dir=DIR\n"
      "  strata-server --flagfile=FILE    (the same flags, one --flag=value per line)");
  strata::ConfigureMutexDeadlockChecks();
  strata::BlockShutdownSignals();
  strata::RetainFreedHeapMemory();
  // Past a file-size limit (RLIMIT_FSIZE) a write fails with EFBIG, as on a
  // full disk, and the storage probe reports it, instead of killing the server.
  signal(SIGXFSZ, SIG_IGN);
  strata::ShardServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.advertise_address = absl::GetFlag(FLAGS_advertise);
  options.zone = absl::GetFlag(FLAGS_zone);
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.tls = strata::TlsFilesFromFlags();
  strata::PreferAes128GcmWithTls(options.tls, "server");
  options.auth = absl::GetFlag(FLAGS_auth);
  options.max_pull_wait = absl::Milliseconds(absl::GetFlag(FLAGS_max_pull_wait_ms));
  const int64_t gpu_budget_mib = absl::GetFlag(FLAGS_gpu_budget_mib);
  options.gpu_budget_bytes = gpu_budget_mib > 0 ? gpu_budget_mib << 20 : gpu_budget_mib;
  options.gpu_device = absl::GetFlag(FLAGS_gpu_device);
  options.host_budget_bytes = absl::GetFlag(FLAGS_host_budget_mib) << 20;
  options.host_prefault_bytes = absl::GetFlag(FLAGS_host_prefault_mib) << 20;
  options.pin_host_memory = absl::GetFlag(FLAGS_pin_host_memory);
  if (absl::GetFlag(FLAGS_nvme_budget_mib) > 0) options.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
  options.nvme_budget_bytes = absl::GetFlag(FLAGS_nvme_budget_mib) << 20;
  options.nvme_queue_depth = absl::GetFlag(FLAGS_nvme_queue_depth);
  options.executor_threads = absl::GetFlag(FLAGS_executor_threads);
  options.nvme_executor_threads = absl::GetFlag(FLAGS_nvme_executor_threads);
  options.save_host_chunks = absl::GetFlag(FLAGS_save_host_chunks);
  options.checkpoint_buffer_bytes = absl::GetFlag(FLAGS_checkpoint_buffer_mib) << 20;
  options.checkpoint_memory_limit_bytes = absl::GetFlag(FLAGS_checkpoint_memory_limit_mib) << 20;
  options.register_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout_s));
  options.storage_probe_interval = absl::Milliseconds(absl::GetFlag(FLAGS_storage_probe_ms));
  options.metrics_listen_address = absl::GetFlag(FLAGS_metrics_listen);
  auto server = strata::ShardServer::Start(options);
  return strata::ServeUntilSignal("strata-server", "server", server,
                                  absl::GetFlag(FLAGS_ready_file));
}
