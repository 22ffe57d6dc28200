// Identity: who a call comes from (DESIGN.md, "Security model"), as the
// Authenticator (rpc/authenticator.h) found it. A value type.
#ifndef STRATA_RPC_IDENTITY_H_
#define STRATA_RPC_IDENTITY_H_

#include <string>

namespace strata {

enum class Role {
  kNone,         // no credentials
  kOperator,     // an admin token: everything
  kUser,         // a user's token: creates jobs, owns them
  kWorker,       // a job's worker token: that job's step and membership
  kCoordinator,  // the coordinator's certificate
  kShardServer,  // a shard server's certificate
};

struct Identity {
  Role role = Role::kNone;
  std::string name;    // operator's or user's name; empty otherwise
  std::string job_id;  // a worker's job; empty otherwise
};

// "user alice", "worker of job j1", "the coordinator", "no credentials", ...
std::string Describe(const Identity& who);

}  // namespace strata

#endif  // STRATA_RPC_IDENTITY_H_
