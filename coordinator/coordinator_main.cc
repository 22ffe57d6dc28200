// strata-coordinator: the coordinator. See --help.
#include "absl/flags/flag.h"
#include "coordinator/coordinator_server.h"
#include "core/command_line.h"
#include "core/mutex_checks.h"
#include "core/signals.h"
#include "rpc/tls_ciphers.h"
#include "rpc/tls_flags.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7700", "host:port to serve on; port 0 picks a free port");
ABSL_FLAG(std::string, data_dir, "/var/lib/strata/coordinator",
          "directory for the coordinator's RocksDB state");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where jobs without a checkpoint directory of their own save checkpoints (a path "
          "the shard servers share); empty: <data_dir>/checkpoints");
ABSL_FLAG(std::string, checkpoint_root, "",
          "every checkpoint directory a request names (SaveCheckpoint, ListCheckpoints, a job's "
          "checkpoint_dir, a restore) must resolve inside this directory, after '..' and "
          "symlinks; empty: --checkpoint_dir (or its default)");
ABSL_FLAG(int64_t, worker_lease_ms, 3000,
          "a worker without a heartbeat for this long leaves its job (its peers re-form); one "
          "whose connection closes and is not opened again within 300 ms (its process ended) "
          "leaves then");
ABSL_FLAG(int64_t, server_timeout_ms, 30000,
          "a shard server failing its health checks for this long is lost: the chunks of its "
          "jobs move to the live servers, restored from each job's newest checkpoint, and the "
          "workers resume from its step");
ABSL_FLAG(std::string, auth_file, "",
          "operators' and users' tokens, one per line: \"operator NAME TOKEN\" or \"user NAME "
          "TOKEN\" (16-256 printable characters; '#' comments). Turns authentication on (needs "
          "TLS): users create and own jobs, each job's workers get a token of their own, "
          "operators may do anything, shard servers are known by their certificates (CN "
          "strata-server). Empty: no authentication");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks a free port; "
          "empty: no metrics endpoint");
ABSL_FLAG(std::string, ready_file, "",
          "when set, the bound host:port is written to this file once serving");

int main(int argc, char** argv) {
  strata::InitCommandLine(
      argc, argv,
      "strata-coordinator: the coordinator of a strata cluster. Registers shard\n"
      "servers, creates jobs and assigns their chunks to servers, keeps each job's\n"
      "workers (leases renewed by heartbeats) and their generations, and serves the\n"
      "rendezvous store the collectives use, and saves checkpoints of jobs (asked\n"
      "for, or every N steps) with the shard servers into --checkpoint_dir. A shard\n"
      "server unhealthy for --server_timeout_ms is lost: its jobs resume on the live\n"
      "servers from their newest checkpoints. State is kept in RocksDB under\n"
      "--data_dir; stops cleanly on SIGINT/SIGTERM.\n\n"
      "  strata-coordinator --listen=HOST:PORT --data_dir=DIR [--worker_lease_ms=MS]\n"
      "                     [--checkpoint_dir=DIR] [--server_timeout_ms=MS]\n"
      "  strata-coordinator --flagfile=FILE    (the same flags, one --flag=value per line)");
  strata::ConfigureMutexDeadlockChecks();
  strata::BlockShutdownSignals();
  strata::CoordinatorOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  options.tls = strata::TlsFilesFromFlags();
  strata::PreferAes128GcmWithTls(options.tls, "coordinator");
  options.auth_file = absl::GetFlag(FLAGS_auth_file);
  options.worker_lease = absl::Milliseconds(absl::GetFlag(FLAGS_worker_lease_ms));
  options.server_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_server_timeout_ms));
  options.metrics_listen_address = absl::GetFlag(FLAGS_metrics_listen);
  auto coordinator = strata::Coordinator::Start(options);
  return strata::ServeUntilSignal("strata-coordinator", "coordinator", coordinator,
                                  absl::GetFlag(FLAGS_ready_file));
}
