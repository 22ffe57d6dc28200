#include "coordinator/server_record.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/host_port.h"
#include "core/quoted.h"
#include "core/status_macros.h"

namespace strata {
namespace {

absl::Status CheckBudget(const char* field, uint64_t bytes) {
  if (bytes > kMaxTierBudgetBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server.", field, " ", bytes, " exceeds the limit of ", kMaxTierBudgetBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateServerRecord(const v1::ServerRecord& server) {
  RETURN_IF_ERROR(ValidateHostPort("server.address", server.address()));
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
