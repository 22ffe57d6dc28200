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
  ASSIGN_OR_RETURN(coordinator->metrics_, Metrics::Start(options.metrics_listen_address));
  coordinator->service_->ExportMetrics(coordinator->metrics_.get());
  ASSIGN_OR_RETURN(coordinator->server_,
                   Serve(options.listen_address, options.tls, coordinator->service_.get(),
                         coordinator->metrics_.get(), &coordinator->address_));
  MarkServing(coordinator->server_.get(), v1::Coordinator::service_full_name());
  LogEventCat("coordinator", "serving on ", coordinator->address_, ", ", DescribeTls(options.tls));
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
  service_.reset();
  metadata_.reset();
  LogEventCat("coordinator", "shut down ", address_);
}

}  // namespace strata
