// gRPC settings shared by every strata channel and server: message size
// limits (bulk tensors travel in messages of a few MiB) and keepalive.
// Stateless and thread-safe.
#ifndef STRATA_RPC_GRPC_UTIL_H_
#define STRATA_RPC_GRPC_UTIL_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/grpc_status.h"
#include "rpc/tls.h"

namespace strata {

// Largest message a strata server or client accepts, both ways.
inline constexpr int kMaxMessageBytes = 64 << 20;
// Largest tensor payload a client puts in one message.
inline constexpr uint64_t kMaxPayloadBytes = 2 << 20;

// A channel to `address` with `credentials` (rpc/tls.h; default plaintext).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, const ChannelCredentials& credentials = PlaintextCredentials());
void ConfigureServerBuilder(grpc::ServerBuilder& builder);

// Calls unary `method` of a synchronous `stub` with a deadline `timeout` from
// now: CallUnary(stub, &v1::Coordinator::Stub::GetJob, request, &job, timeout).
template <typename Stub, typename Request, typename Response>
absl::Status CallUnary(Stub* stub,
                       grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                    Response*),
                       const Request& request, Response* response, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return FromGrpcStatus((stub->*method)(&context, request, response));
}

// Calls unary `method` (its full name: rpc/step_wire.h) of `stub` with raw
// buffers in the protobuf wire format, blocking, with a deadline `timeout`
// from now.
absl::Status CallRawUnary(grpc::GenericStub* stub, const std::string& method,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response,
                          absl::Duration timeout);

}  // namespace strata

#endif  // STRATA_RPC_GRPC_UTIL_H_
