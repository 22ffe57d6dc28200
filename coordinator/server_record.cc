#include "coordinator/server_record.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/quoted.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr size_t kMaxAddressBytes = 255;

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

absl::Status CheckBudget(const char* field, uint64_t bytes) {
  if (bytes > kMaxTierBudgetBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.", field, " ", bytes, " exceeds the limit of ", kMaxTierBudgetBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateServerRecord(const v1::ServerRecord& server) {
  const absl::string_view address = server.address();
  const size_t colon = address.rfind(':');
  if (address.size() > kMaxAddressBytes || colon == absl::string_view::npos ||
      !IsHostName(address.substr(0, colon)) || !IsPort(address.substr(colon + 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.address ", Quoted(address),
                     " is not HOST:PORT (a DNS name, IPv4 or [IPv6] address; port 1-65535)"));
  }
  const absl::string_view zone = server.zone();
  if (zone.size() > kMaxZoneBytes || !std::all_of(zone.begin(), zone.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
               c == '-';
      })) {
    return absl::InvalidArgumentError(absl::StrCat("server.zone ", Quoted(zone), " is not at most ",
                                                   kMaxZoneBytes,
                                                   " bytes of letters, digits, '.', '_' and '-'"));
  }
  RETURN_IF_ERROR(CheckBudget("host_budget_bytes", server.host_budget_bytes()));
  RETURN_IF_ERROR(CheckBudget("nvme_budget_bytes", server.nvme_budget_bytes()));
  return CheckBudget("gpu_budget_bytes", server.gpu_budget_bytes());
}

}  // namespace strata
