// Coordinator: an in-process coordinator daemon -- its RocksDB metadata, its
// service and its gRPC server. strata-coordinator's main() runs one; tests and
// strata-bench start one in a process. Start() returns once serving;
// Shutdown() (also run by the destructor) ends the generation streams, stops
// gRPC and closes RocksDB. Not thread-safe: one owner calls Shutdown.
#ifndef STRATA_COORDINATOR_COORDINATOR_SERVER_H_
#define STRATA_COORDINATOR_COORDINATOR_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "rpc/metrics.h"
#include "rpc/tls.h"
#include "storage/metadata_store.h"

namespace strata {

struct CoordinatorOptions {
  std::string listen_address = "127.0.0.1:0";
  std::string data_dir;
  // Where jobs without a checkpoint_dir of their own save checkpoints
  // (absolute; shared with the shard servers); empty: data_dir/checkpoints.
  std::string checkpoint_dir;
  // The directory every checkpoint directory named in a request (SaveCheckpoint,
  // ListCheckpoints, a job's checkpoint_dir, CreateJob's restore_from) must
  // resolve inside; empty: checkpoint_dir.
  std::string checkpoint_root;
  // Its server's certificate, also presented to the shard servers; plaintext
  // without (rpc/tls.h).
  TlsFiles tls;
  // The operators' and users' tokens (rpc/authenticator.h); needs `tls`.
  // Empty: no authentication -- any caller may do anything, which the
  // start-up line says.
  std::string auth_file;
  // A worker without a heartbeat for this long leaves its job.
  absl::Duration worker_lease = absl::Seconds(3);
  // A shard server failing its health checks for this long is lost: its
  // jobs' chunks move to the live servers, restored from their checkpoints.
  absl::Duration server_timeout = absl::Seconds(30);
  // host:port of the Prometheus endpoint (/metrics); empty: none.
  std::string metrics_listen_address;
};

class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Start(const CoordinatorOptions& options);
  ~Coordinator();
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_->address(); }
  void Shutdown();

 private:
  Coordinator() = default;
  std::string address_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetadataStore> metadata_;
  std::unique_ptr<CoordinatorService> service_;
  // With `auth_file`: who calls, and the gate every call passes.
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AuthorizedCoordinator> authorized_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_COORDINATOR_SERVER_H_
