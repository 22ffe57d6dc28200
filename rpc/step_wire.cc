#include "rpc/step_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

constexpr int kPushGradsField = v1::PushRequest::kGradsFieldNumber;
constexpr int kPullStepField = v1::PullResponse::kStepFieldNumber;
constexpr int kPullParamsField = v1::PullResponse::kParamsFieldNumber;

// `fields` serialized, then the key and length of bytes field `field` of
// `bytes` bytes: the field's bytes come next on the wire.
grpc::Slice HeadOfBytesField(const google::protobuf::MessageLite& fields, int field, size_t bytes) {
  std::string head = fields.SerializeAsString();
  {
    StringOutputStream stream(&head);
    CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint64(bytes);
  }
  return grpc::Slice(head);
}

}  // namespace

grpc::ByteBuffer PushRequestBuffer(const v1::PushRequest& fields, const uint8_t* grads,
                                   size_t bytes) {
  grpc::Slice slices[2] = {HeadOfBytesField(fields, kPushGradsField, bytes),
                           grpc::Slice(grads, bytes, grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, bytes > 0 ? 2 : 1);
}

grpc::ByteBuffer PullResponseBuffer(int64_t step, v1::DType dtype, const void* params,
                                    size_t bytes) {
  v1::PullResponse fields;
  fields.set_step(step);
  fields.set_dtype(dtype);
  grpc::Slice slices[2] = {HeadOfBytesField(fields, kPullParamsField, bytes),
                           grpc::Slice(params, bytes)};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer MessageBuffer(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ReadPullResponse(grpc::ByteBuffer* buffer, int64_t* step, uint8_t* out,
                              size_t expected_bytes) {
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT32_MAX);
  bool got_params = false;
  *step = 0;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == kPullStepField &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t value;
      if (!in.ReadVarint64(&value)) break;
      *step = static_cast<int64_t>(value);
    } else if (field == kPullParamsField &&
               WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint64_t length;
      if (!in.ReadVarint64(&length)) break;
      if (length != expected_bytes) {
        return absl::InternalError(
            absl::StrCat("a pull returned ", length, " bytes; ", expected_bytes, " expected"));
      }
      if (!in.ReadRaw(out, static_cast<int>(length))) break;
      got_params = true;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  if (!in.ConsumedEntireMessage() || (!got_params && expected_bytes > 0)) {
    return absl::InternalError("a pull's response does not parse or has no parameters");
  }
  return absl::OkStatus();
}

}  // namespace strata
