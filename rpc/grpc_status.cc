#include "rpc/grpc_status.h"

#include "absl/strings/str_cat.h"

#include <string>

namespace strata {

// absl::StatusCode and grpc::StatusCode share their numbering (both follow
// google.rpc.Code), so the conversion keeps the code and the message.
grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status WithShardAddress(const absl::Status& s, const std::string& address) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("shard server ", address, ": ", s.message()));
}

}  // namespace strata
