#include "rpc/certified_host.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/host_port.h"
#include "core/quoted.h"

namespace strata {
namespace {

// The most names an error lists.
constexpr size_t kMaxNamesShown = 8;

}  // namespace

bool CertificateNameMatches(absl::string_view name, absl::string_view host) {
  if (!absl::StartsWith(name, "*.")) return absl::EqualsIgnoreCase(name, host);
  // "*.rest" matches "label.rest": one non-empty label, never an IP address.
  const size_t dot = host.find('.');
  return dot != absl::string_view::npos && dot > 0 && host.find(':') == absl::string_view::npos &&
         absl::EqualsIgnoreCase(host.substr(dot), name.substr(1));
}

absl::Status CheckHostAmong(const std::vector<std::string>& names, absl::string_view field,
                            absl::string_view address) {
  const absl::string_view host = HostOf(address);
  for (const std::string& name : names) {
    if (CertificateNameMatches(name, host)) return absl::OkStatus();
  }
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + std::min(names.size(), kMaxNamesShown));
  return absl::PermissionDeniedError(
      absl::StrCat(field, " ", Quoted(address), ": the caller's certificate is not valid for host ",
                   Quoted(host), " (it names ", shown.empty() ? "none" : absl::StrJoin(shown, ", "),
                   names.size() > shown.size() ? ", ..." : "", ")"));
}

absl::Status CheckCertifiedHost(const grpc::ServerContextBase& ctx, absl::string_view field,
                                absl::string_view address) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated() || !ValidateHostPort(field, address).ok()) {
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const grpc::string_ref& name : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    names.emplace_back(name.data(), name.size());
  }
  return CheckHostAmong(names, field, address);
}

}  // namespace strata
