#include "core/host_port.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/quoted.h"

namespace strata {
namespace {

bool IsHostName(absl::string_view host) {
  if (host.empty()) return false;
  if (host.front() == '[') {  // [IPv6]
    if (host.size() < 3 || host.back() != ']') return false;
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return false;
      }
    }
    return true;
  }
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') return false;
  }
  return host.front() != '-' && host.front() != '.';
}

bool IsPort(absl::string_view port) {
  if (port.empty() || port.size() > 5 || port.front() == '0') return false;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  uint32_t value = 0;
  return absl::SimpleAtoi(port, &value) && value <= 65535;
}

}  // namespace

absl::Status ValidateHostPort(absl::string_view field, absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (address.size() > kMaxHostPortBytes || colon == absl::string_view::npos ||
      !IsHostName(address.substr(0, colon)) || !IsPort(address.substr(colon + 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", Quoted(address),
                     " is not HOST:PORT (a DNS name, IPv4 or [IPv6] address; port 1-65535)"));
  }
  return absl::OkStatus();
}

absl::string_view HostOf(absl::string_view address) {
  absl::string_view host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

}  // namespace strata
