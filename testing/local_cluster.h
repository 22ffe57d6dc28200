// LocalCluster: a coordinator and N shard servers in this process, on
// loopback ports, with their data in a fresh temporary directory that is
// removed on destruction. For tests and strata-bench. Not thread-safe.
#ifndef STRATA_TESTING_LOCAL_CLUSTER_H_
#define STRATA_TESTING_LOCAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_server.h"
#include "shard/shard_server.h"

namespace strata {

struct LocalClusterOptions {
  int num_servers = 2;
  uint64_t host_budget_bytes = uint64_t{1} << 30;
  // Per server (ShardServerOptions::host_prefault_bytes).
  uint64_t host_prefault_bytes = 0;
  int executor_threads = 1;
  // Off by default: tests and benchmarks run as users with a small memlock limit.
  bool pin_host_memory = false;
  // Per server (ShardServerOptions).
  uint64_t checkpoint_buffer_bytes = 0;
  uint64_t checkpoint_memory_limit_bytes = ShardServerOptions::kDefaultCheckpointMemoryLimitBytes;
  // Per server; 0: no NVMe tier.
  uint64_t nvme_budget_bytes = 0;
  // Per server, on GPU 0 (ShardServerOptions::gpu_budget_bytes); none by default.
  int64_t gpu_budget_bytes = ShardServerOptions::kNoGpuTier;
  absl::Duration worker_lease = absl::Seconds(3);
  // The coordinator's (CoordinatorOptions::server_timeout).
  absl::Duration server_timeout = CoordinatorOptions().server_timeout;
  // Per server (ShardServerOptions::max_pull_wait).
  absl::Duration max_pull_wait = ShardServerOptions().max_pull_wait;
  // Serve every daemon's Prometheus metrics on a free loopback port.
  bool serve_metrics = false;
  // The checkpoint root of the coordinator and the servers; empty: the
  // system's temporary directory (where tests make their scratch dirs).
  std::string checkpoint_root;
  // TLS of the coordinator and of every server (rpc/tls.h); none: plaintext.
  TlsFiles coordinator_tls;
  TlsFiles server_tls;
  // Authentication (needs TLS): the coordinator's --auth_file, and --auth on
  // every server; empty: none.
  std::string auth_file;
  // Servers save their host-memory chunks when they stop (RestartServer()
  // then brings them back); off: the data directory goes with the cluster.
  bool save_host_chunks = false;
};

class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  const std::string& coordinator_address() const { return coordinator_->address(); }
  const std::string& coordinator_metrics_address() const { return coordinator_->metrics_address(); }
  const std::vector<std::unique_ptr<ShardServer>>& servers() const { return servers_; }
  const std::string& data_dir() const { return data_dir_; }
  // Stops server `i` cleanly and starts it again on its data directory and
  // address, as a rolling upgrade does.
  absl::Status RestartServer(int i);

 private:
  LocalCluster() = default;
  std::string data_dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<ShardServerOptions> server_options_;  // as started, per server
  std::vector<std::unique_ptr<ShardServer>> servers_;
};

}  // namespace strata

#endif  // STRATA_TESTING_LOCAL_CLUSTER_H_
