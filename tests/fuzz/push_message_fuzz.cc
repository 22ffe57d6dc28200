// Fuzzes a shard server's reading of a push (rpc/step_wire.h PushMessage)
// against protobuf's parser: for any bytes, received in any slices, both
// refuse, or both read the same fields and the same gradients. Input: 1
// byte that sets where the bytes are cut into slices, then the message.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rpc/step_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t slice_bytes = 1 + data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += slice_bytes) {
    slices.emplace_back(bytes.data() + at, std::min(slice_bytes, bytes.size() - at));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  strata::v1::PushRequest want;
  const bool parses = want.ParseFromString(bytes);
  std::unique_ptr<strata::PushMessage> got = strata::PushMessage::Parse(buffer);
  if ((got != nullptr) != parses) __builtin_trap();
  if (got == nullptr) return 0;
  std::string grads;
  for (absl::string_view piece : got->grads()) grads.append(piece.data(), piece.size());
  if (grads != want.grads() || got->grads_bytes() != grads.size()) __builtin_trap();
  want.clear_grads();
  if (got->fields().SerializeAsString() != want.SerializeAsString()) __builtin_trap();
  return 0;
}
