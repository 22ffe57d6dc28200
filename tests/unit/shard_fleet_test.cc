// ShardFleet::Reconnect: a server restarted at an address the fleet's channel
// last failed to reach is reached at once, not after the channel's backoff.
#include "coordinator/shard_fleet.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {
namespace {

// A shard server service whose every RPC is UNIMPLEMENTED (the generated
// defaults), which tells a reached server from an unreached one.
v1::ShardServer::CallbackService unimplemented;

// A gRPC server of `unimplemented` at 127.0.0.1:`port` (0: any free port).
std::unique_ptr<grpc::Server> UnimplementedServer(int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", *port), grpc::InsecureServerCredentials(),
                           port);
  builder.RegisterService(&unimplemented);
  return builder.BuildAndStart();
}

absl::Status ListChunks(ShardFleet& fleet, const std::string& address) {
  v1::ListChunksRequest request;
  v1::ListChunksResponse response;
  return CallUnary(fleet.Stub(address), &v1::ShardServer::Stub::ListChunks, request, &response,
                   absl::Seconds(5));
}

TEST(ShardFleetTest, AServerRestartedAtAnAddressIsReachedAtOnceAfterReconnect) {
  int port = 0;
  std::unique_ptr<grpc::Server> first = UnimplementedServer(&port);
  ASSERT_NE(first, nullptr);
  first->Shutdown();
  first.reset();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  ShardFleet fleet(absl::Seconds(5), PlaintextCredentials());
  // Nothing listens: the channel fails and backs off (1 s at least).
  EXPECT_TRUE(absl::IsUnavailable(ListChunks(fleet, address)));

  std::unique_ptr<grpc::Server> second = UnimplementedServer(&port);
  ASSERT_NE(second, nullptr);
  // The channel reconnects in the background, at once: well within the
  // backoff it would otherwise wait out (without Reconnect this call is
  // UNAVAILABLE).
  fleet.Reconnect(address);
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Status reached = ListChunks(fleet, address);
  EXPECT_TRUE(absl::IsUnimplemented(reached)) << reached;
  second->Shutdown();
}

}  // namespace
}  // namespace strata
