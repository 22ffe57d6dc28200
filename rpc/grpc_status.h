// Conversion between absl::Status and grpc::Status: the one place where the
// two meet. Services return ToGrpcStatus(s); clients call FromGrpcStatus(s).
// Stateless and thread-safe.
#ifndef STRATA_RPC_GRPC_STATUS_H_
#define STRATA_RPC_GRPC_STATUS_H_

#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace strata {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// `s` with "shard server ADDRESS: " before its message; OK stays OK.
absl::Status WithShardAddress(const absl::Status& s, const std::string& address);

// Finishes a unary callback RPC with `status` and returns its reactor:
// `return FinishUnary(ctx, DoWork(request));`
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const absl::Status& status);

}  // namespace strata

#endif  // STRATA_RPC_GRPC_STATUS_H_
