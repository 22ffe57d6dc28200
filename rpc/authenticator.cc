#include "rpc/authenticator.h"

#include <fstream>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "rpc/token.h"

namespace strata {

std::string Describe(const Identity& who) {
  switch (who.role) {
    case Role::kNone:
      return "a caller without credentials";
    case Role::kOperator:
      return absl::StrCat("operator ", who.name);
    case Role::kUser:
      return absl::StrCat("user ", who.name);
    case Role::kWorker:
      return absl::StrCat("a worker of job '", who.job_id, "'");
    case Role::kCoordinator:
      return "the coordinator";
    case Role::kShardServer:
      return "a shard server";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const std::string& auth_file,
                                                                     const WorkerTokens* workers) {
  std::unique_ptr<Authenticator> auth(new Authenticator(workers));
  if (auth_file.empty()) return auth;
  std::ifstream in(auth_file);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--auth_file: cannot read ", auth_file));
  absl::flat_hash_set<std::string> names;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = absl::StrCat("--auth_file ", auth_file, " line ", number);
    absl::string_view content = line;
    if (size_t hash = content.find('#'); hash != absl::string_view::npos) {
      content = content.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(content, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 3 || (fields[0] != "operator" && fields[0] != "user")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": want \"operator NAME TOKEN\" or \"user NAME TOKEN\""));
    }
    RETURN_IF_ERROR(ValidateToken(fields[2], where));
    if (!names.insert(std::string(fields[1])).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name ", fields[1], " is taken by an earlier line"));
    }
    Identity who;
    who.role = fields[0] == "operator" ? Role::kOperator : Role::kUser;
    who.name = std::string(fields[1]);
    if (!auth->people_.emplace(TokenDigest(fields[2]), who).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the token is an earlier line's too"));
    }
    (who.role == Role::kOperator ? auth->num_operators_ : auth->num_users_)++;
  }
  return auth;
}

std::string DescribeAuth(const Authenticator* auth) {
  if (auth == nullptr) {
    return "NO AUTHENTICATION: any caller may act on every job (use --auth_file with TLS beyond "
           "a local demo)";
  }
  return absl::StrCat("authentication on: ", auth->num_operators(), " operator(s), ",
                      auth->num_users(),
                      " user(s), the daemons' certificates and the jobs' "
                      "worker tokens");
}

absl::StatusOr<Identity> Authenticator::Identify(const grpc::ServerContextBase& ctx) const {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
      const absl::string_view cn(name.data(), name.size());
      if (cn == kCoordinatorCommonName) return Identity{Role::kCoordinator, "", ""};
      if (cn == kShardServerCommonName) return Identity{Role::kShardServer, "", ""};
    }
  }
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) return Identity{};
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, kBearerPrefix) ||
      !ValidateToken(value, kAuthorizationKey).ok()) {
    return absl::UnauthenticatedError("the authorization header is not \"Bearer TOKEN\"");
  }
  const std::string digest = TokenDigest(value);
  if (auto person = people_.find(digest); person != people_.end()) return person->second;
  if (workers_ != nullptr) {
    if (std::optional<std::string> job = workers_->JobOfToken(digest)) {
      return Identity{Role::kWorker, "", *job};
    }
  }
  return absl::UnauthenticatedError(
      "the token is not known here (a deleted job's, or another cluster's?)");
}

}  // namespace strata
