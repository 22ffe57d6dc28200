// The --tls_cert, --tls_key and --tls_ca flags every strata daemon and tool
// takes, defined once (library strata_tls_flags, linked by binaries only, so
// that no user program linking the client gets these flags).
#ifndef STRATA_RPC_TLS_FLAGS_H_
#define STRATA_RPC_TLS_FLAGS_H_

#include "rpc/tls.h"

namespace strata {

// The flags' values; call after the command line is parsed.
TlsFiles TlsFilesFromFlags();

}  // namespace strata

#endif  // STRATA_RPC_TLS_FLAGS_H_
