// Starting a daemon's gRPC server: the shared settings (rpc/grpc_util.h), the
// RPC metrics interceptor and the standard health service. Stateless and
// thread-safe.
#ifndef STRATA_RPC_SERVE_H_
#define STRATA_RPC_SERVE_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/metrics.h"
#include "rpc/tls.h"

namespace strata {

// How long a daemon's Shutdown() lets RPCs in flight finish before it cancels them.
inline constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

// Builds and starts a gRPC server on `listen_address` serving `service`; sets
// `*address` to the host of `listen_address` with the bound port. The server
// also serves the standard health service (grpc.health.v1), NOT_SERVING until
// MarkServing(), and counts its RPCs into `metrics`. TLS with `tls`
// (rpc/tls.h), plaintext without. UNAVAILABLE when it cannot listen there;
// INVALID_ARGUMENT for unusable TLS files.
absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(const std::string& listen_address,
                                                    const TlsFiles& tls, grpc::Service* service,
                                                    Metrics* metrics, std::string* address);

// The health service answers SERVING (NOT_SERVING when !`serving`) for the
// whole server ("") and for `service_name`, until the server shuts down.
void MarkServing(grpc::Server* server, const char* service_name, bool serving = true);

}  // namespace strata

#endif  // STRATA_RPC_SERVE_H_
