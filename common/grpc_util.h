// gRPC settings shared by every strata channel and server: message size
// limits (bulk tensors travel in messages of a few MiB) and keepalive.
// Stateless and thread-safe.
#ifndef STRATA_COMMON_GRPC_UTIL_H_
#define STRATA_COMMON_GRPC_UTIL_H_

#include <grpcpp/channel.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

namespace strata {

// Largest message a strata server or client accepts, both ways.
inline constexpr int kMaxMessageBytes = 64 << 20;
// Largest tensor payload a client puts in one message.
inline constexpr uint64_t kMaxPayloadBytes = 2 << 20;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
void ConfigureServerBuilder(grpc::ServerBuilder& builder);

}  // namespace strata

#endif  // STRATA_COMMON_GRPC_UTIL_H_
