#include "rpc/grpc_util.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/synchronization/notification.h"

namespace strata {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ChannelCredentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Distinct channels to the same address get distinct connections.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // A restarted peer is reconnected within a second, a quick restart (a
  // rolling upgrade) within a few tenths: the backoff starts at 100 ms, not
  // gRPC's 1 s, and stops growing at 1 s, not 2 minutes (a shard server
  // back after a long outage would fail the coordinator's health checks
  // that long, and be declared lost again).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::Status CallRawUnary(grpc::GenericStub* stub, const std::string& method,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response,
                          absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  absl::Notification done;
  grpc::Status status;
  stub->UnaryCall(&context, method, grpc::StubOptions(), &request, response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return FromGrpcStatus(status);
}

void ConfigureServerBuilder(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
}

}  // namespace strata
