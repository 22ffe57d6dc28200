// The step's tensor bytes on the wire without protobuf copies. A push goes
// out as its PushRequest's other fields, serialized, followed by the
// gradients' bytes referenced where they lie (gRPC writes them to the socket
// from there), and a server reads it without copying them (PushMessage: the
// gradients stay in gRPC's receive buffers); a server's PullResponse holds
// its parameters copied once; a
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
#include <memory>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// A PushRequest as a server receives it: its fields but the gradients
// parsed, and the gradients' bytes where gRPC received them, piece after
// piece (a piece ends where a receive buffer does, at any byte). The
// message keeps those buffers: the pieces are valid while it lives.
// Thread-safety: immutable once parsed.
class PushMessage {
 public:
  // Parses `buffer` (taking a reference to its slices, not a copy); null when
  // it does not parse as a PushRequest (protobuf's parser would refuse it).
  static std::unique_ptr<PushMessage> Parse(const grpc::ByteBuffer& buffer);
  PushMessage(const PushMessage&) = delete;
  PushMessage& operator=(const PushMessage&) = delete;

  // Every field but grads, which is empty.
  const v1::PushRequest& fields() const { return fields_; }
  // The grads field's bytes, in order.
  const std::vector<absl::string_view>& grads() const { return grads_; }
  size_t grads_bytes() const { return grads_bytes_; }

 private:
  PushMessage() = default;

  std::vector<grpc::Slice> slices_;  // the message's, referenced
  v1::PushRequest fields_;
  std::vector<absl::string_view> grads_;
  size_t grads_bytes_ = 0;
};

// A small message (a pull request) as a buffer.
grpc::ByteBuffer MessageBuffer(const google::protobuf::Message& message);
// Parses `buffer` (left as it was) into `*message`; false when it does not
// parse.
bool ParseMessageBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// A PullResponse of `step` with `params`: referenced, not copied, when
// `owner` is set -- gRPC sends them from where they are and keeps `owner`
// until it lets go of the buffer's last slice, which must keep [params,
// params + bytes) alive and unchanged until then --; copied into the buffer
// when it is null.
grpc::ByteBuffer PullResponseBuffer(int64_t step, v1::DType dtype, const void* params, size_t bytes,
                                    std::shared_ptr<const void> owner);

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
