// Authenticator: finds who a call comes from. A peer certificate (verified
// against the CA by TLS) whose common name is kCoordinatorCommonName or
// kShardServerCommonName makes the caller the coordinator or a shard
// server; otherwise a bearer token (rpc/token.h) is looked up among the
// people of the auth file (operators and users) and then among the jobs'
// worker tokens (WorkerTokens). No token and no such certificate: Role::
// kNone. Thread-safe once created; WorkerTokens must be.
#ifndef STRATA_RPC_AUTHENTICATOR_H_
#define STRATA_RPC_AUTHENTICATOR_H_

#include <grpcpp/server_context.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rpc/identity.h"

namespace strata {

// The common names (CN) of the certificates that identify the daemons
// (deploy/make-certs.sh makes them so).
inline constexpr char kCoordinatorCommonName[] = "strata-coordinator";
inline constexpr char kShardServerCommonName[] = "strata-server";

// The jobs' worker tokens, by digest (rpc/token.h: TokenDigest).
class WorkerTokens {
 public:
  virtual ~WorkerTokens() = default;
  // The job whose worker token has `digest`; nullopt when none has.
  virtual std::optional<std::string> JobOfToken(absl::string_view digest) const = 0;
};

class Authenticator {
 public:
  // `auth_file`: lines "operator NAME TOKEN" or "user NAME TOKEN" ('#'
  // starts a comment; names are unique, tokens too); empty: no people (a
  // shard server's). INVALID_ARGUMENT naming the line that is wrong, never
  // quoting a token. `workers` (may be null: no worker tokens) must outlive
  // the authenticator.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& auth_file,
                                                               const WorkerTokens* workers);

  // The caller of `ctx`'s call; UNAUTHENTICATED for a malformed
  // authorization header or a token no one has.
  absl::StatusOr<Identity> Identify(const grpc::ServerContextBase& ctx) const;

  // Counts of operators and users, for start-up lines.
  int num_operators() const { return num_operators_; }
  int num_users() const { return num_users_; }

 private:
  explicit Authenticator(const WorkerTokens* workers) : workers_(workers) {}

  const WorkerTokens* const workers_;
  absl::flat_hash_map<std::string, Identity> people_;  // by token digest
  int num_operators_ = 0;
  int num_users_ = 0;
};

// "authentication: N operator(s), M user(s), job worker tokens" or, for
// null, "NO AUTHENTICATION: ..." -- for start-up lines.
std::string DescribeAuth(const Authenticator* auth);

}  // namespace strata

#endif  // STRATA_RPC_AUTHENTICATOR_H_
