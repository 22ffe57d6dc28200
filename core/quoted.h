// Quoted(value): a value from a request, fit for an error message or a log
// line -- in single quotes, cut to its first 64 bytes (with the full size
// named) so that a hostile megabyte is never echoed, and with bytes outside
// printable ASCII escaped. Stateless.
#ifndef STRATA_CORE_QUOTED_H_
#define STRATA_CORE_QUOTED_H_

#include <string>

#include "absl/strings/string_view.h"

namespace strata {

inline constexpr size_t kMaxQuotedBytes = 64;

std::string Quoted(absl::string_view value);

}  // namespace strata

#endif  // STRATA_CORE_QUOTED_H_
