#include "rpc/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process presents (daemons: required for TLS; tools: "
          "optional); empty with --tls_ca empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that peers' certificates must chain to; setting it turns TLS on");

namespace strata {

TlsFiles TlsFilesFromFlags() {
  return TlsFiles{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                  absl::GetFlag(FLAGS_tls_ca)};
}

}  // namespace strata
