// The step's tensor bytes on the wire without protobuf copies. A push goes
// out as its PushRequest's other fields, serialized, followed by the
// gradients' bytes referenced where they lie (gRPC writes them to the socket
// from there); a server's PullResponse holds its parameters copied once; a
// client reads them with one copy, from gRPC's receive buffers straight to
// where they belong. A ReadStateResponse of a chunk's stored state (a seed
// reads one) goes the same way. The wire format is the protobuf one.
//
// Thread-safety: functions of their arguments only.
#ifndef STRATA_RPC_STEP_WIRE_H_
#define STRATA_RPC_STEP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "strata/v1/shard.pb.h"

namespace strata {

// The full method names the generic calls use.
inline constexpr char kPushMethod[] = "/strata.v1.ShardServer/Push";
inline constexpr char kPullMethod[] = "/strata.v1.ShardServer/Pull";
inline constexpr char kReadStateMethod[] = "/strata.v1.ShardServer/ReadState";

// `fields` (whose grads must be empty) then `grads` as its grads field; the
// `bytes` at `grads` must stay unchanged until the call that sends the
// buffer ends.
grpc::ByteBuffer PushRequestBuffer(const v1::PushRequest& fields, const uint8_t* grads,
                                   size_t bytes);

// A small message (a pull request) as a buffer.
grpc::ByteBuffer MessageBuffer(const google::protobuf::Message& message);
// Parses `buffer` (left as it was) into `*message`; false when it does not
// parse.
bool ParseMessageBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// A PullResponse of `step` with `params` (copied once, into the buffer).
grpc::ByteBuffer PullResponseBuffer(int64_t step, v1::DType dtype, const void* params,
                                    size_t bytes);

// Parses a PullResponse from `buffer`: its step into `*step` and its params
// into `out`, which takes exactly `expected_bytes` (INTERNAL otherwise, or for
// a message that does not parse).
absl::Status ReadPullResponse(grpc::ByteBuffer* buffer, int64_t* step, uint8_t* out,
                              size_t expected_bytes);

// A ReadStateResponse whose stored_state is the `bytes` that `fill` writes
// at the pointer it is given (the buffer's own memory: copied once) and
// whose applied_step is what `fill` returns; its error otherwise.
absl::StatusOr<grpc::ByteBuffer> StoredStateResponseBuffer(
    size_t bytes, absl::FunctionRef<absl::StatusOr<int64_t>(uint8_t*)> fill);

// Parses a ReadStateResponse from `buffer`: its applied_step into `*step`
// and its stored_state into `out`, span after span, which take exactly its
// bytes (INTERNAL otherwise, or for a message that does not parse; the
// spans may then hold part of it).
absl::Status ReadStoredStateResponse(grpc::ByteBuffer* buffer, int64_t* step,
                                     absl::Span<const absl::Span<std::byte>> out);

}  // namespace strata

#endif  // STRATA_RPC_STEP_WIRE_H_
