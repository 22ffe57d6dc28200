#include "core/quoted.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace strata {

std::string Quoted(absl::string_view value) {
  if (value.size() <= kMaxQuotedBytes) return absl::StrCat("'", absl::CHexEscape(value), "'");
  return absl::StrCat("'", absl::CHexEscape(value.substr(0, kMaxQuotedBytes)), "...' (",
                      value.size(), " bytes)");
}

}  // namespace strata
