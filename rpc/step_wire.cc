#include "rpc/step_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/slice.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

constexpr int kPushGradsField = v1::PushRequest::kGradsFieldNumber;
constexpr int kPullStepField = v1::PullResponse::kStepFieldNumber;
constexpr int kPullParamsField = v1::PullResponse::kParamsFieldNumber;
constexpr int kStateStepField = v1::ReadStateResponse::kAppliedStepFieldNumber;
constexpr int kStoredStateField = v1::ReadStateResponse::kStoredStateFieldNumber;

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

// A slice of `bytes` at `data`, not copied, that keeps `owner` until gRPC
// lets go of it (it calls the destroy function once, with its user data,
// when the slice's last reference goes).
grpc::Slice ReferencedSlice(const void* data, size_t bytes, std::shared_ptr<const void> owner) {
  auto* kept = new std::shared_ptr<const void>(std::move(owner));
  return grpc::Slice(
      grpc_slice_new_with_user_data(
          const_cast<void*>(data), bytes,
          [](void* user_data) { delete static_cast<std::shared_ptr<const void>*>(user_data); },
          kept),
      grpc::Slice::STEAL_REF);
}

// Parses a message of varint field `step_field` (into `*step`; 0 when
// absent) and bytes field `bytes_field`, read into `out` span after span,
// which must take exactly its bytes; INTERNAL naming `what` and `field_name`
// otherwise.
absl::Status ReadStepAndBytes(grpc::ByteBuffer* buffer, int step_field, int bytes_field,
                              absl::Span<const absl::Span<std::byte>> out, absl::string_view what,
                              absl::string_view field_name, int64_t* step) {
  size_t expected_bytes = 0;
  for (const absl::Span<std::byte>& span : out) expected_bytes += span.size();
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT32_MAX);
  bool got_bytes = false;
  *step = 0;
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == step_field &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t value;
      if (!in.ReadVarint64(&value)) break;
      *step = static_cast<int64_t>(value);
    } else if (field == bytes_field &&
               WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint64_t length;
      if (!in.ReadVarint64(&length)) break;
      if (length != expected_bytes) {
        return absl::InternalError(
            absl::StrCat(what, " returned ", length, " bytes; ", expected_bytes, " expected"));
      }
      bool read = true;
      for (const absl::Span<std::byte>& span : out) {
        read = read && in.ReadRaw(span.data(), static_cast<int>(span.size()));
      }
      if (!read) break;
      got_bytes = true;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  if (!in.ConsumedEntireMessage() || (!got_bytes && expected_bytes > 0)) {
    return absl::InternalError(
        absl::StrCat(what, "'s response does not parse or has no ", field_name));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ByteBuffer PushRequestBuffer(const v1::PushRequest& fields, const uint8_t* grads,
                                   size_t bytes) {
  grpc::Slice slices[2] = {HeadOfBytesField(fields, kPushGradsField, bytes),
                           grpc::Slice(grads, bytes, grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, bytes > 0 ? 2 : 1);
}

namespace {

// Reads a message's bytes across slices, appending what it reads to a
// record while recording.
class SliceReader {
 public:
  SliceReader(const std::vector<grpc::Slice>& slices, std::string* record)
      : slices_(slices), record_(record) {}

  bool at_end() {
    SkipEmpty();
    return slice_ == slices_.size();
  }
  void set_recording(bool recording) { recording_ = recording; }

  // A varint of at most 10 bytes; false when the bytes end first.
  bool ReadVarint(uint64_t* value, int* length) {
    *value = 0;
    for (*length = 0; *length < 10; ++*length) {
      SkipEmpty();
      if (slice_ == slices_.size()) return false;
      const uint8_t byte = slices_[slice_].begin()[offset_++];
      if (recording_) record_->push_back(static_cast<char>(byte));
      *value |= uint64_t{byte & 0x7fu} << (7 * *length);
      if (byte < 0x80) {
        ++*length;
        return true;
      }
    }
    return false;
  }

  // The next `n` bytes, piece by piece to `take` (null: recorded only);
  // false when fewer remain.
  bool Read(uint64_t n, std::vector<absl::string_view>* take) {
    while (n > 0) {
      SkipEmpty();
      if (slice_ == slices_.size()) return false;
      const grpc::Slice& slice = slices_[slice_];
      const size_t size = std::min<uint64_t>(n, slice.size() - offset_);
      const char* data = reinterpret_cast<const char*>(slice.begin()) + offset_;
      if (recording_) record_->append(data, size);
      if (take != nullptr) take->emplace_back(data, size);
      offset_ += size;
      n -= size;
    }
    return true;
  }

 private:
  void SkipEmpty() {
    while (slice_ < slices_.size() && offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  std::string* const record_;
  bool recording_ = true;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

// The largest length protobuf's parser reads (its ReadSize()).
constexpr uint64_t kMaxFieldLength = INT32_MAX - 16;

}  // namespace

std::unique_ptr<PushMessage> PushMessage::Parse(const grpc::ByteBuffer& buffer) {
  std::unique_ptr<PushMessage> message(new PushMessage());
  if (!buffer.Dump(&message->slices_).ok()) return nullptr;
  // All the message's bytes but the gradients' (their length written as 0) go
  // to `fields` as they are, for protobuf's parser to read: it decides what
  // parses. Only the fields' bounds are read here.
  std::string fields;
  SliceReader in(message->slices_, &fields);
  int group_depth = 0;
  while (!in.at_end()) {
    uint64_t tag;
    int length;
    if (!in.ReadVarint(&tag, &length)) return nullptr;
    switch (tag & 7) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t value;
        if (!in.ReadVarint(&value, &length)) return nullptr;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64:
        if (!in.Read(8, nullptr)) return nullptr;
        break;
      case WireFormatLite::WIRETYPE_FIXED32:
        if (!in.Read(4, nullptr)) return nullptr;
        break;
      case WireFormatLite::WIRETYPE_START_GROUP:
        ++group_depth;
        break;
      case WireFormatLite::WIRETYPE_END_GROUP:
        --group_depth;
        break;
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        const bool grads = group_depth == 0 &&
                           tag == WireFormatLite::MakeTag(
                                      kPushGradsField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
        uint64_t size;
        if (grads) {
          fields.push_back('\0');
          in.set_recording(false);
        }
        // As protobuf's parser reads a length: 5 bytes at most.
        if (!in.ReadVarint(&size, &length) || length > 5 || size > kMaxFieldLength) return nullptr;
        if (grads) {
          // The last grads field is the message's, as for any bytes field.
          message->grads_.clear();
          message->grads_bytes_ = size;
        }
        if (!in.Read(size, grads ? &message->grads_ : nullptr)) return nullptr;
        in.set_recording(true);
        break;
      }
      default:
        return nullptr;
    }
  }
  if (!message->fields_.ParseFromString(fields)) return nullptr;
  return message;
}

grpc::ByteBuffer PullResponseBuffer(int64_t step, v1::DType dtype, const void* params, size_t bytes,
                                    std::shared_ptr<const void> owner) {
  v1::PullResponse fields;
  fields.set_step(step);
  fields.set_dtype(dtype);
  grpc::Slice slices[2] = {HeadOfBytesField(fields, kPullParamsField, bytes),
                           owner == nullptr ? grpc::Slice(params, bytes)
                                            : ReferencedSlice(params, bytes, std::move(owner))};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer MessageBuffer(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseMessageBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  grpc::ByteBuffer copy(buffer);  // the reader consumes its buffer
  grpc::ProtoBufferReader reader(&copy);
  return message->ParseFromZeroCopyStream(&reader);
}

absl::StatusOr<grpc::ByteBuffer> StoredStateResponseBuffer(
    size_t bytes, absl::FunctionRef<absl::StatusOr<int64_t>(uint8_t*)> fill) {
  grpc_slice state = grpc_slice_malloc(bytes);
  grpc::Slice owned(state, grpc::Slice::STEAL_REF);
  ASSIGN_OR_RETURN(const int64_t step, fill(GRPC_SLICE_START_PTR(state)));
  // The step follows the state: protobuf fields may come in any order.
  v1::ReadStateResponse tail;
  tail.set_applied_step(step);
  grpc::Slice slices[3] = {HeadOfBytesField(v1::ReadStateResponse(), kStoredStateField, bytes),
                           std::move(owned), grpc::Slice(tail.SerializeAsString())};
  return grpc::ByteBuffer(slices, 3);
}

absl::Status ReadPullResponse(grpc::ByteBuffer* buffer, int64_t* step, uint8_t* out,
                              size_t expected_bytes) {
  const absl::Span<std::byte> params(reinterpret_cast<std::byte*>(out), expected_bytes);
  return ReadStepAndBytes(buffer, kPullStepField, kPullParamsField, {&params, 1}, "a pull",
                          "parameters", step);
}

absl::Status ReadStoredStateResponse(grpc::ByteBuffer* buffer, int64_t* step,
                                     absl::Span<const absl::Span<std::byte>> out) {
  return ReadStepAndBytes(buffer, kStateStepField, kStoredStateField, out, "a state read",
                          "stored state", step);
}

}  // namespace strata
