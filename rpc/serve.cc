#include "rpc/serve.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace strata {

absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(const std::string& listen_address,
                                                    const TlsFiles& tls, grpc::Service* service,
                                                    Metrics* metrics, std::string* address) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(metrics->RpcInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  ConfigureServerBuilder(builder);
  int port = 0;
  builder.AddListeningPort(listen_address, credentials, &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen_address, " (address in use or not valid?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  std::string host = listen_address.substr(0, listen_address.rfind(':'));
  *address = absl::StrCat(host, ":", port);
  return server;
}

void MarkServing(grpc::Server* server, const char* service_name, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(serving);
  health->SetServingStatus(service_name, serving);
}

}  // namespace strata
