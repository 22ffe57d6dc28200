#include "rpc/auth_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/quoted.h"

namespace strata {
namespace {

constexpr absl::string_view kCoordinator = "strata.v1.Coordinator";
constexpr absl::string_view kShard = "strata.v1.ShardServer";

}  // namespace

const std::vector<MethodPolicy>& AuthPolicyTable() {
  // The job's RPCs: its workers, its owner and the operator.
  const std::vector<Role> job = {Role::kWorker, Role::kUser, Role::kOperator};
  // The shard servers' control RPCs: the coordinator's alone.
  const std::vector<Role> control = {Role::kCoordinator};
  // A job's state on the shard servers: its workers (its owner and the
  // operator with the job's worker token, from GetJob) and the coordinator.
  const std::vector<Role> state = {Role::kWorker, Role::kCoordinator};
  static const std::vector<MethodPolicy>* table = new std::vector<MethodPolicy>{
      {kCoordinator, "RegisterServer", {Role::kShardServer}},
      {kCoordinator, "CreateJob", job},
      {kCoordinator, "GetJob", job},
      {kCoordinator, "ListJobs", {Role::kOperator}},
      {kCoordinator, "DeleteJob", {Role::kUser, Role::kOperator}},
      {kCoordinator, "JoinJob", job},
      {kCoordinator, "Heartbeat", job},
      {kCoordinator, "LeaveJob", job},
      {kCoordinator, "RenewGeneration", job},
      {kCoordinator, "WatchGeneration", job},
      {kCoordinator, "ListMembers", job},
      {kCoordinator, "GetPlacement", job},
      {kCoordinator, "SaveCheckpoint", job},
      {kCoordinator, "ListCheckpoints", job},
      {kCoordinator, "DrainServer", {Role::kOperator}},
      {kCoordinator, "RebalanceJob", {Role::kUser, Role::kOperator}},
      {kCoordinator, "KvSet", job},
      {kCoordinator, "KvGet", job},
      {kShard, "AllocateChunks", control},
      {kShard, "DropJob", control},
      {kShard, "WriteParams", state},
      {kShard, "WriteState", state},
      {kShard, "Push", state},
      {kShard, "CommitStep", state},
      {kShard, "Pull", state},
      {kShard, "ReadState", state},
      {kShard, "ListChunks", control},
      {kShard, "SaveChunks", control},
      {kShard, "LoadChunks", control},
      {kShard, "SeedChunks", control},
      {kShard, "ReadStepLog", state},
  };
  return *table;
}

absl::Status Authorize(const Identity& who, absl::string_view service, absl::string_view method,
                       absl::string_view job_id, const std::optional<std::string>& owner) {
  const std::vector<MethodPolicy>& table = AuthPolicyTable();
  auto policy = std::find_if(table.begin(), table.end(), [&](const MethodPolicy& p) {
    return p.service == service && p.method == method;
  });
  if (policy == table.end()) {
    return absl::InternalError(absl::StrCat(service, "/", method, " has no authorization policy"));
  }
  if (who.role == Role::kNone) {
    return absl::UnauthenticatedError(
        absl::StrCat(method, " needs credentials: a token (token_file, --token_file) over TLS"));
  }
  const std::string denied = absl::StrCat(Describe(who), " may not call ", method);
  if (std::find(policy->roles.begin(), policy->roles.end(), who.role) == policy->roles.end()) {
    return absl::PermissionDeniedError(denied);
  }
  if (who.role != Role::kWorker && who.role != Role::kUser) return absl::OkStatus();
  if (job_id.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(denied, " beyond a job of its own"));
  }
  if (who.role == Role::kWorker && who.job_id != job_id) {
    return absl::PermissionDeniedError(absl::StrCat(denied, " on job ", Quoted(job_id)));
  }
  if (who.role == Role::kUser) {
    // A job no one has: a user may create it, and finds nothing else.
    if (!owner.has_value() && method != "CreateJob") {
      return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
    }
    if (owner.has_value() && *owner != who.name) {
      return absl::PermissionDeniedError(
          absl::StrCat(denied, " on job ", Quoted(job_id), " (not its owner)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
