// PreferAes128Gcm: the TLS 1.3 cipher suite a daemon's channels and servers
// choose. gRPC leaves OpenSSL's default order alone, which puts
// TLS_AES_256_GCM_SHA384 first: every byte strata moves over TLS would be
// sealed and opened with AES-256-GCM, which runs at two thirds of
// AES-128-GCM's speed on AES-NI cores (10 rounds against 14), where both
// keep 128-bit security or more. After this call every OpenSSL context the
// process makes (gRPC's among them) offers TLS_AES_128_GCM_SHA256 first and,
// as a server, picks by its own order (so workers whose library offers
// AES-256-GCM first get AES-128-GCM too) -- by OpenSSL's configuration
// (`ssl_conf`, its `system_default` section): the system's settings there
// (MinProtocol, CipherString, ...) are kept, and so are its Ciphersuites
// where it names some (an operator who wants AES-256-GCM names them there).
//
// Process-wide: call once at start-up, before any TLS credentials are made;
// not thread-safe with other OpenSSL configuration.
#ifndef STRATA_RPC_TLS_CIPHERS_H_
#define STRATA_RPC_TLS_CIPHERS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rpc/tls.h"

namespace strata {

// OpenSSL's TLS 1.3 suites, AES-128-GCM first.
inline constexpr char kAes128GcmFirst[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";

// The preference above. FAILED_PRECONDITION, with OpenSSL's configuration
// left as it was, for a system setting it cannot carry over (not plain
// text); INTERNAL when OpenSSL refuses the configuration or a context made
// afterwards lacks the preference.
absl::Status PreferAes128Gcm();

// PreferAes128Gcm() for a daemon's main when `tls` is on; a failure is
// logged as `component`'s (its TLS then keeps OpenSSL's order).
void PreferAes128GcmWithTls(const TlsFiles& tls, absl::string_view component);

}  // namespace strata

#endif  // STRATA_RPC_TLS_CIPHERS_H_
