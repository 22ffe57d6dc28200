// TLS for strata's gRPC servers and channels. A daemon or client is given
// PEM files (TlsFiles); all empty means plaintext, which daemons announce in
// their start-up line. A TLS server presents its certificate and asks every
// client for one, verifying it against the CA when presented: coordinator
// and shard servers present theirs to each other (mutual TLS), workers and
// tools may present none. A TLS channel verifies the server's certificate
// against the CA (the address's host must be among its names) and presents
// its own certificate when it has one. Stateless and thread-safe; files are
// read when credentials are made.
#ifndef STRATA_RPC_TLS_H_
#define STRATA_RPC_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct TlsFiles {
  std::string cert_file;  // this side's certificate chain (PEM)
  std::string key_file;   // its private key (PEM)
  std::string ca_file;    // the CA certificate(s) that peers' certificates chain to
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// Credentials a channel is made with (MakeChannel).
using ChannelCredentials = std::shared_ptr<grpc::ChannelCredentials>;

// Plaintext without `files`, else TLS: a server needs cert, key and CA; a
// channel needs the CA, and cert with key or neither. INVALID_ARGUMENT naming
// the flag (--tls_cert, --tls_key, --tls_ca) that is missing or unreadable.
// A channel's calls present `token` (rpc/token.h) when it is not empty,
// which needs TLS.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);
absl::StatusOr<ChannelCredentials> MakeChannelCredentials(const TlsFiles& files,
                                                          const std::string& token = "");

// Plaintext channel credentials.
ChannelCredentials PlaintextCredentials();

// "TLS (mutual with certificate FILE)" or "PLAINTEXT ...", for start-up lines.
std::string DescribeTls(const TlsFiles& files);

}  // namespace strata

#endif  // STRATA_RPC_TLS_H_
