// CheckCertifiedHost: whether the certificate a caller presented names the
// host of an address it asks a daemon to dial -- a shard server registers
// only an address its certificate is valid for, so a server certificate
// cannot point the coordinator at any other host. Names are the
// certificate's subject alternative names as gRPC's TLS reports them: DNS
// names (a "*" left-most label matches one label, RFC 6125) and IP
// addresses. Stateless.
#ifndef STRATA_RPC_CERTIFIED_HOST_H_
#define STRATA_RPC_CERTIFIED_HOST_H_

#include <grpcpp/server_context.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

// Whether certificate name `name` matches `host` (ASCII case ignored; an
// IPv6 host without its brackets).
bool CertificateNameMatches(absl::string_view name, absl::string_view host);

// OK when one of `names` matches the host of `address` (HOST:PORT, valid
// by ValidateHostPort); PERMISSION_DENIED naming `field`, the host and the
// names otherwise.
absl::Status CheckHostAmong(const std::vector<std::string>& names, absl::string_view field,
                            absl::string_view address);

// CheckHostAmong the subject alternative names of the peer certificate of
// `ctx`'s call; OK when the call has no verified peer certificate (no TLS,
// or a caller identified by a token) or `address` is not HOST:PORT (the
// service refuses that itself).
absl::Status CheckCertifiedHost(const grpc::ServerContextBase& ctx, absl::string_view field,
                                absl::string_view address);

}  // namespace strata

#endif  // STRATA_RPC_CERTIFIED_HOST_H_
