// ValidateHostPort: whether a string names a server as HOST:PORT -- HOST a
// DNS name, an IPv4 address or a bracketed IPv6 one, PORT 1-65535, 255
// bytes at most -- before anything dials it or stores it; HostOf: its HOST.
// Stateless.
#ifndef STRATA_CORE_HOST_PORT_H_
#define STRATA_CORE_HOST_PORT_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

inline constexpr size_t kMaxHostPortBytes = 255;

// OK for a HOST:PORT address; INVALID_ARGUMENT naming `field` and quoting
// `address` (truncated) otherwise.
absl::Status ValidateHostPort(absl::string_view field, absl::string_view address);

// The HOST of an address ValidateHostPort accepts, an IPv6 address without
// its brackets ("[::1]:7700" -> "::1").
absl::string_view HostOf(absl::string_view address);

}  // namespace strata

#endif  // STRATA_CORE_HOST_PORT_H_
