// Bearer tokens: how users, operators and a job's workers prove who they
// are (rpc/authenticator.h). A token is read from a file (never a flag, so
// that it shows in no `ps` and no log), sent as `authorization: Bearer T`
// over TLS only, and kept by the daemons as its SHA-256 digest where they
// need not hand it out again. Stateless and thread-safe.
#ifndef STRATA_RPC_TOKEN_H_
#define STRATA_RPC_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

// The metadata key a token travels under, and its value's prefix.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

// A token is 16 to kMaxTokenBytes printable ASCII characters without spaces.
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 256;

// Checks `token`'s form; INVALID_ARGUMENT naming `field`, never quoting it.
absl::Status ValidateToken(absl::string_view token, absl::string_view field);

// The token in `path`: its first line, surrounding white space removed.
// INVALID_ARGUMENT naming `flag` when the file cannot be read or holds no
// valid token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, absl::string_view flag);

// SHA-256 of `token`, 64 lowercase hex digits.
std::string TokenDigest(absl::string_view token);

// A new token: 32 bytes from the kernel's random source, as 64 hex digits.
absl::StatusOr<std::string> NewToken();

}  // namespace strata

#endif  // STRATA_RPC_TOKEN_H_
