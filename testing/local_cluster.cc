#include "testing/local_cluster.h"

#include <stdlib.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  std::string pattern = (std::filesystem::temp_directory_path() / "strata-cluster-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", pattern));
  }
  cluster->data_dir_ = pattern;
  const std::string checkpoint_root = options.checkpoint_root.empty()
                                          ? std::filesystem::temp_directory_path().string()
                                          : options.checkpoint_root;
  CoordinatorOptions coordinator;
  coordinator.checkpoint_root = checkpoint_root;
  coordinator.tls = options.coordinator_tls;
  coordinator.auth_file = options.auth_file;
  coordinator.data_dir = absl::StrCat(pattern, "/coordinator");
  coordinator.worker_lease = options.worker_lease;
  coordinator.server_timeout = options.server_timeout;
  if (options.serve_metrics) coordinator.metrics_listen_address = "127.0.0.1:0";
  ASSIGN_OR_RETURN(cluster->coordinator_, Coordinator::Start(coordinator));
  for (int i = 0; i < options.num_servers; ++i) {
    ShardServerOptions server;
    server.coordinator_address = cluster->coordinator_->address();
    server.data_dir = absl::StrCat(pattern, "/server", i);
    server.checkpoint_root = checkpoint_root;
    server.tls = options.server_tls;
    server.auth = !options.auth_file.empty();
    server.gpu_budget_bytes = options.gpu_budget_bytes;
    server.host_budget_bytes = options.host_budget_bytes;
    server.host_prefault_bytes = options.host_prefault_bytes;
    server.executor_threads = options.executor_threads;
    server.max_pull_wait = options.max_pull_wait;
    server.nvme_executor_threads = options.executor_threads;
    server.pin_host_memory = options.pin_host_memory;
    server.checkpoint_buffer_bytes = options.checkpoint_buffer_bytes;
    server.checkpoint_memory_limit_bytes = options.checkpoint_memory_limit_bytes;
    server.save_host_chunks = options.save_host_chunks;
    if (options.serve_metrics) server.metrics_listen_address = "127.0.0.1:0";
    if (options.nvme_budget_bytes > 0) {
      server.nvme_dir = absl::StrCat(server.data_dir, "/nvme");
      server.nvme_budget_bytes = options.nvme_budget_bytes;
    }
    ASSIGN_OR_RETURN(auto started, ShardServer::Start(server));
    server.listen_address = started->address();  // where a restart listens
    cluster->server_options_.push_back(std::move(server));
    cluster->servers_.push_back(std::move(started));
  }
  return cluster;
}

absl::Status LocalCluster::RestartServer(int i) {
  if (i < 0 || i >= static_cast<int>(servers_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("server ", i, " of a cluster of ", servers_.size()));
  }
  servers_[i].reset();  // a clean shutdown
  ASSIGN_OR_RETURN(servers_[i], ShardServer::Start(server_options_[i]));
  return absl::OkStatus();
}

LocalCluster::~LocalCluster() {
  servers_.clear();
  coordinator_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(data_dir_, ignored);
}

}  // namespace strata
