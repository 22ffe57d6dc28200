#include "coordinator/coordinator_server.h"

#include <filesystem>

#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/serve.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> coordinator(new Coordinator());
  ASSIGN_OR_RETURN(ChannelCredentials shard_credentials, MakeChannelCredentials(options.tls));
  ASSIGN_OR_RETURN(coordinator->metadata_, MetadataStore::OpenInDataDir(options.data_dir));
  ASSIGN_OR_RETURN(
      coordinator->service_,
      CoordinatorService::Create(coordinator->metadata_.get(), options.worker_lease,
                                 std::filesystem::absolute(options.checkpoint_dir.empty()
                                                               ? options.data_dir + "/checkpoints"
                                                               : options.checkpoint_dir)
                                     .string(),
                                 options.checkpoint_root, options.server_timeout,
                                 std::move(shard_credentials)));
  grpc::Service* served = coordinator->service_.get();
  if (!options.auth_file.empty()) {
    if (!options.tls.enabled()) {
      return absl::InvalidArgumentError(
          "--auth_file needs TLS (--tls_cert, --tls_key, --tls_ca): tokens travel in the clear "
          "without it");
    }
    ASSIGN_OR_RETURN(coordinator->auth_,
                     Authenticator::Create(options.auth_file, coordinator->service_.get()));
    coordinator->service_->SetAuthenticator(coordinator->auth_.get());
    coordinator->authorized_ = std::make_unique<AuthorizedCoordinator>(
        coordinator->service_.get(), coordinator->auth_.get(), coordinator->service_.get());
    served = coordinator->authorized_.get();
  }
  ASSIGN_OR_RETURN(coordinator->metrics_, Metrics::Start(options.metrics_listen_address));
  coordinator->service_->ExportMetrics(coordinator->metrics_.get());
  ASSIGN_OR_RETURN(coordinator->server_,
                   Serve(options.listen_address, options.tls, served, coordinator->metrics_.get(),
                         &coordinator->address_));
  MarkServing(coordinator->server_.get(), v1::Coordinator::service_full_name());
  LogEventCat("coordinator", "serving on ", coordinator->address_, ", ", DescribeTls(options.tls),
              "; ", DescribeAuth(coordinator->auth_.get()));
  return coordinator;
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->Shutdown();  // NOT_SERVING from now on
  service_->BeginShutdown();                     // ends the generation streams
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server_.reset();
  metrics_.reset();  // before the service its scrapes read
  authorized_.reset();
  service_.reset();
  auth_.reset();
  metadata_.reset();
  LogEventCat("coordinator", "shut down ", address_);
}

}  // namespace strata
