// rpc/step_wire.h against protobuf's own serializer and parser: a push
// built from its fields and referenced gradients parses as the same
// PushRequest, a server reads any push (in slices cut anywhere, broken or
// not) as protobuf does, without copying its gradients, a server's pull response as the same
// PullResponse and its stored-state read as the same ReadStateResponse; pull responses and state
// reads are read into place with their step; wrong sizes and garbage are
// refused.
#include "rpc/step_wire.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(random());
  return bytes;
}

TEST(StepWireTest, APushBufferParsesAsThePushRequest) {
  v1::PushRequest fields;
  fields.set_job_id("job");
  fields.set_step(7);
  fields.set_flat_begin(1 << 20);
  fields.set_num_params(300000);
  fields.set_dtype(v1::DTYPE_BF16);
  fields.set_generation(3);
  fields.set_attempt(2);
  fields.set_scalars_follow(true);
  const std::vector<uint8_t> grads = RandomBytes(600000, 1);
  grpc::ByteBuffer buffer = PushRequestBuffer(fields, grads.data(), grads.size());
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(buffer)));
  v1::PushRequest want = fields;
  want.set_grads(grads.data(), grads.size());
  EXPECT_EQ(parsed.SerializeAsString(), want.SerializeAsString());
  // The gradients are sent from where they lie, not copied.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[1].begin(), grads.data());
}

// `bytes` as gRPC might receive them: in slices cut at random places, of
// `min_slice` bytes or more (gRPC keeps slices of up to 23 bytes inline,
// copied with the slice).
grpc::ByteBuffer InRandomSlices(const std::string& bytes, std::mt19937* random,
                                size_t min_slice = 1) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size();) {
    size_t size = std::min<size_t>(bytes.size() - at, min_slice + (*random)() % 9000);
    if (bytes.size() - at - size < min_slice) size = bytes.size() - at;
    slices.emplace_back(bytes.data() + at, size);
    at += size;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::PushRequest RandomPush(std::mt19937* random) {
  v1::PushRequest push;
  push.set_job_id("job-" + std::to_string((*random)() % 100));
  push.set_step(1 + (*random)() % 1000);
  push.set_flat_begin((*random)() % (1 << 20));
  push.set_num_params(1 + (*random)() % 30000);
  push.set_dtype(v1::DTYPE_BF16);
  push.set_generation((*random)() % 7);
  push.set_attempt((*random)() % 3);
  push.set_coef(0.5f);
  if ((*random)() % 2 == 0) push.set_lr(1e-3f);
  push.add_group_lrs(2e-3f);
  push.set_scalars_follow((*random)() % 2 == 0);
  const std::vector<uint8_t> grads = RandomBytes(push.num_params() * 2, (*random)());
  push.set_grads(grads.data(), grads.size());
  return push;
}

// PushMessage::Parse() of `buffer` against protobuf's parser of its bytes:
// both refuse, or both give the same fields and the same gradients.
// Returns whether protobuf parses it.
bool ExpectParsesAsProtobuf(const grpc::ByteBuffer& buffer) {
  const std::string bytes = Bytes(buffer);
  v1::PushRequest want;
  const bool parses = want.ParseFromString(bytes);
  std::unique_ptr<PushMessage> got = PushMessage::Parse(buffer);
  EXPECT_EQ(got != nullptr, parses) << absl::BytesToHexString(bytes);
  if (!parses || got == nullptr) return parses;
  std::string grads;
  for (absl::string_view piece : got->grads()) grads.append(piece.data(), piece.size());
  EXPECT_EQ(got->grads_bytes(), grads.size());
  EXPECT_EQ(grads, want.grads());
  want.clear_grads();
  EXPECT_EQ(got->fields().SerializeAsString(), want.SerializeAsString());
  return parses;
}

TEST(StepWireTest, AServerReadsAPushAsProtobufDoesWithoutCopyingTheGradients) {
  std::mt19937 random(testing::TestSeed());
  for (int i = 0; i < 50; ++i) {
    const v1::PushRequest push = RandomPush(&random);
    grpc::ByteBuffer buffer = InRandomSlices(push.SerializeAsString(), &random, 64);
    ExpectParsesAsProtobuf(buffer);
    // Every piece lies in one of the received slices.
    std::unique_ptr<PushMessage> message = PushMessage::Parse(buffer);
    ASSERT_NE(message, nullptr);
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    for (absl::string_view piece : message->grads()) {
      bool inside = false;
      for (const grpc::Slice& s : slices) {
        const char* begin = reinterpret_cast<const char*>(s.begin());
        inside =
            inside || (piece.data() >= begin && piece.data() + piece.size() <= begin + s.size());
      }
      EXPECT_TRUE(inside);
    }
    EXPECT_GE(message->grads().size(), push.grads().size() / 9000);
  }
}

TEST(StepWireTest, ABrokenPushIsRefusedAsProtobufRefusesIt) {
  std::mt19937 random(testing::TestSeed());
  int parsed = 0, refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = RandomPush(&random).SerializeAsString();
    switch (i % 3) {
      case 0:  // cut anywhere
        bytes.resize(random() % bytes.size());
        break;
      case 1:  // bytes changed among the fields and the gradients' length
        for (int k = 0; k < 3; ++k) bytes[random() % std::min<size_t>(bytes.size(), 64)] = random();
        break;
      case 2: {  // garbage appended
        const std::vector<uint8_t> tail = RandomBytes(1 + random() % 16, random());
        bytes.append(tail.begin(), tail.end());
        break;
      }
    }
    (ExpectParsesAsProtobuf(InRandomSlices(bytes, &random)) ? parsed : refused)++;
  }
  // Both kinds were tried.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
  // A grads field with another wire type is an unknown field, as for protobuf.
  std::string odd;
  {
    google::protobuf::io::StringOutputStream stream(&odd);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
        v1::PushRequest::kGradsFieldNumber,
        google::protobuf::internal::WireFormatLite::WIRETYPE_VARINT));
    out.WriteVarint64(5);
  }
  std::mt19937 fixed(1);
  ExpectParsesAsProtobuf(InRandomSlices(odd, &fixed));
}

// A pull's answer references the parameters where they are, and keeps
// their owner until the last copy of the buffer goes.
TEST(StepWireTest, APullResponseSendsTheParametersWhereTheyAre) {
  auto params = std::make_shared<const std::vector<uint8_t>>(RandomBytes(100000, 4));
  std::weak_ptr<const std::vector<uint8_t>> owner = params;
  auto buffer = std::make_unique<grpc::ByteBuffer>(
      PullResponseBuffer(3, v1::DTYPE_FP16, params->data(), params->size(), params));
  const uint8_t* const where = params->data();
  params.reset();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer->Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[1].begin(), where);  // not a copy
  EXPECT_EQ(slices[1].size(), 100000u);
  auto copy = std::make_unique<grpc::ByteBuffer>(*buffer);  // as gRPC refs it to send
  buffer.reset();
  slices.clear();
  EXPECT_FALSE(owner.expired());
  copy.reset();
  EXPECT_TRUE(owner.expired());
}

TEST(StepWireTest, AServersPullResponseParsesAsThePullResponse) {
  const std::vector<uint8_t> params = RandomBytes(300000, 3);
  grpc::ByteBuffer buffer =
      PullResponseBuffer(9, v1::DTYPE_BF16, params.data(), params.size(), nullptr);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  EXPECT_NE(slices.back().begin(), params.data());  // no owner: a copy
  slices.clear();
  v1::PullResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(buffer)));
  EXPECT_EQ(parsed.step(), 9);
  EXPECT_EQ(parsed.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(parsed.params(), std::string(params.begin(), params.end()));
  // And the client reads it back into place.
  std::vector<uint8_t> out(params.size());
  int64_t step;
  ASSERT_TRUE(ReadPullResponse(&buffer, &step, out.data(), out.size()).ok());
  EXPECT_EQ(step, 9);
  EXPECT_EQ(out, params);
}

TEST(StepWireTest, APullResponseIsReadIntoPlace) {
  v1::PullResponse response;
  response.set_step(12);
  response.set_dtype(v1::DTYPE_FP16);
  const std::vector<uint8_t> params = RandomBytes(1 << 20, 2);
  response.set_params(params.data(), params.size());
  grpc::Slice slice(response.SerializeAsString());
  grpc::ByteBuffer buffer(&slice, 1);
  std::vector<uint8_t> out(params.size());
  int64_t step = -1;
  ASSERT_TRUE(ReadPullResponse(&buffer, &step, out.data(), out.size()).ok());
  EXPECT_EQ(step, 12);
  EXPECT_EQ(out, params);
}

TEST(StepWireTest, WrongSizesAndGarbageAreRefused) {
  v1::PullResponse response;
  response.set_step(1);
  response.set_params(std::string(100, 'x'));
  grpc::Slice slice(response.SerializeAsString());
  std::vector<uint8_t> out(101, 0);
  int64_t step;
  grpc::ByteBuffer shorter(&slice, 1);
  absl::Status s = ReadPullResponse(&shorter, &step, out.data(), 101);
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_EQ(out, std::vector<uint8_t>(101, 0));  // nothing written
  // A response cut in its parameters.
  std::string cut = response.SerializeAsString();
  cut.resize(cut.size() - 10);
  grpc::Slice cut_slice(cut);
  grpc::ByteBuffer truncated(&cut_slice, 1);
  EXPECT_TRUE(absl::IsInternal(ReadPullResponse(&truncated, &step, out.data(), 100)));
  // No parameters at all.
  v1::PullResponse empty;
  empty.set_step(1);
  grpc::Slice empty_slice(empty.SerializeAsString());
  grpc::ByteBuffer none(&empty_slice, 1);
  EXPECT_TRUE(absl::IsInternal(ReadPullResponse(&none, &step, out.data(), 100)));
}

// A state read filled in place, as a shard server answers it.
absl::StatusOr<grpc::ByteBuffer> StateBuffer(const std::vector<uint8_t>& state, int64_t step) {
  return StoredStateResponseBuffer(state.size(), [&](uint8_t* out) -> absl::StatusOr<int64_t> {
    std::memcpy(out, state.data(), state.size());
    return step;
  });
}

TEST(StepWireTest, AStoredStateReadParsesAsTheReadStateResponseAndIsReadIntoSpans) {
  const std::vector<uint8_t> state = RandomBytes(300000, 4);
  absl::StatusOr<grpc::ByteBuffer> buffer = StateBuffer(state, 41);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  v1::ReadStateResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(*buffer)));
  EXPECT_EQ(parsed.applied_step(), 41);
  EXPECT_EQ(parsed.stored_state(), std::string(state.begin(), state.end()));
  // Read back into spans of uneven sizes, one after another.
  std::vector<std::byte> p(100000), one(1), rest(199999);
  const absl::Span<std::byte> spans[] = {absl::MakeSpan(p), absl::MakeSpan(one),
                                         absl::MakeSpan(rest)};
  int64_t step = -1;
  ASSERT_TRUE(ReadStoredStateResponse(&*buffer, &step, spans).ok());
  EXPECT_EQ(step, 41);
  std::vector<uint8_t> joined;
  for (const auto& span : spans) {
    for (std::byte b : span) joined.push_back(static_cast<uint8_t>(b));
  }
  EXPECT_EQ(joined, state);
}

TEST(StepWireTest, AStateReadsFailureIsItsAndWrongSizesAreRefused) {
  absl::StatusOr<grpc::ByteBuffer> failed =
      StoredStateResponseBuffer(10, [](uint8_t*) -> absl::StatusOr<int64_t> {
        return absl::InvalidArgumentError("the range cuts a block");
      });
  EXPECT_TRUE(absl::IsInvalidArgument(failed.status())) << failed.status();
  absl::StatusOr<grpc::ByteBuffer> buffer = StateBuffer(RandomBytes(10, 5), 3);
  ASSERT_TRUE(buffer.ok());
  std::vector<std::byte> longer(11);
  const absl::Span<std::byte> into[] = {absl::MakeSpan(longer)};
  int64_t step;
  absl::Status s = ReadStoredStateResponse(&*buffer, &step, into);
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_EQ(s.message(), "a state read returned 10 bytes; 11 expected");
  // A typed response without a stored state (FP32 values instead).
  v1::ReadStateResponse values;
  values.set_applied_step(3);
  values.add_params(1.0f);
  grpc::Slice slice(values.SerializeAsString());
  grpc::ByteBuffer typed(&slice, 1);
  EXPECT_TRUE(absl::IsInternal(ReadStoredStateResponse(&typed, &step, into)));
}

}  // namespace
}  // namespace strata
