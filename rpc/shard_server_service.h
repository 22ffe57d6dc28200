// ShardServerService: the shard server's gRPC service type. Push, Pull and
// ReadState take and answer raw buffers in the protobuf wire format
// (rpc/step_wire.h), so that pushed gradients are read where gRPC received
// them and the pulled parameters and the read state are copied once on
// their way out; every other method is a typed callback.
#ifndef STRATA_RPC_SHARD_SERVER_SERVICE_H_
#define STRATA_RPC_SHARD_SERVER_SERVICE_H_

#include "strata/v1/shard.grpc.pb.h"

namespace strata {

using ShardServerService =
    v1::ShardServer::WithRawCallbackMethod_Push<v1::ShardServer::WithRawCallbackMethod_Pull<
        v1::ShardServer::WithRawCallbackMethod_ReadState<v1::ShardServer::CallbackService>>>;

}  // namespace strata

#endif  // STRATA_RPC_SHARD_SERVER_SERVICE_H_
