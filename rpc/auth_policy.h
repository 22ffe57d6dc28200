// The authorization policy (DESIGN.md, "Security model"): for each RPC of
// the Coordinator and ShardServer services, the roles that may call it, and
// for a job's RPC whose job: a worker acts on its own job only, a user on the
// jobs it owns (and creates jobs no one has), the operator, the coordinator
// and the shard servers on any their roles allow. A call without a job (the
// whole fleet: ListJobs, GetPlacement of every job, a key outside any job)
// is for the operator and the daemons only. Stateless and thread-safe.
#ifndef STRATA_RPC_AUTH_POLICY_H_
#define STRATA_RPC_AUTH_POLICY_H_

#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "rpc/identity.h"

namespace strata {

// A method, by its name in its service ("Push"), and the roles it allows.
struct MethodPolicy {
  absl::string_view service;  // "strata.v1.Coordinator" or "strata.v1.ShardServer"
  absl::string_view method;
  std::vector<Role> roles;
};

// Every RPC of both services, with its roles.
const std::vector<MethodPolicy>& AuthPolicyTable();

// Whether `who` may call `service`.`method` on `job_id` (empty: no job),
// whose owner is `owner` (nullopt: no such job). OK, else UNAUTHENTICATED
// (no credentials), PERMISSION_DENIED naming the caller, the method and the
// job, or NOT_FOUND for a user's call on a job that does not exist (other
// than CreateJob); INTERNAL for a method the table lacks.
absl::Status Authorize(const Identity& who, absl::string_view service, absl::string_view method,
                       absl::string_view job_id, const std::optional<std::string>& owner);

}  // namespace strata

#endif  // STRATA_RPC_AUTH_POLICY_H_
