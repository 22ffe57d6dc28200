// PushedGrads and a chunk's apply from gradients in pieces: the pieces cut
// anywhere read back as the bytes they hold, whole elements in place and
// only cut ones (or pieces too small to describe) copied; a chunk applies,
// logs and answers exactly as from the same gradients in one piece, with
// FP32 and 8-bit states.
#include "shard/pushed_grads.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"
#include "shard/chunk.h"
#include "storage/host_tier.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

std::string RandomBytes(size_t n, std::mt19937* random) {
  std::string bytes(n, '\0');
  for (char& b : bytes) b = static_cast<char>((*random)());
  return bytes;
}

// `bytes` cut into pieces of 1 to max_piece bytes.
std::vector<absl::string_view> CutAnywhere(const std::string& bytes, size_t max_piece,
                                           std::mt19937* random) {
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < bytes.size();) {
    const size_t size = std::min<size_t>(bytes.size() - at, 1 + (*random)() % max_piece);
    pieces.emplace_back(bytes.data() + at, size);
    at += size;
  }
  return pieces;
}

// The bytes the ranges give, checking that they cover [offset, offset + n) in order.
std::string Gather(const PushedGrads& grads, uint64_t offset, uint64_t n, size_t element_bytes) {
  std::string out;
  uint64_t next = offset;
  for (const GradRange& r : grads.ranges()) {
    EXPECT_EQ(r.offset, next);
    next = r.offset + r.n;
    out.append(static_cast<const char*>(r.grads), r.n * element_bytes);
  }
  EXPECT_EQ(next, offset + n);
  return out;
}

bool Inside(const void* p, size_t size, const std::string& bytes) {
  const char* c = static_cast<const char*>(p);
  return c >= bytes.data() && c + size <= bytes.data() + bytes.size();
}

TEST(PushedGradsTest, PiecesCutAnywhereReadBackInPlaceButForCutElements) {
  std::mt19937 random(testing::TestSeed());
  for (size_t element_bytes : {2, 4}) {
    for (int i = 0; i < 20; ++i) {
      const uint64_t n = 1 + random() % 200000, offset = random() % 1000;
      const std::string bytes = RandomBytes(n * element_bytes, &random);
      const std::vector<absl::string_view> pieces = CutAnywhere(bytes, 30000, &random);
      absl::StatusOr<PushedGrads> grads = PushedGrads::Cut(offset, n, element_bytes, pieces);
      ASSERT_TRUE(grads.ok()) << grads.status();
      EXPECT_EQ(Gather(*grads, offset, n, element_bytes), bytes);
      if (pieces.size() > 1 && pieces.size() > bytes.size() / PushedGrads::kMinMeanPieceBytes) {
        // Pieces too small on average to be worth describing: one copy.
        ASSERT_EQ(grads->ranges().size(), 1u);
        EXPECT_FALSE(Inside(grads->ranges()[0].grads, bytes.size(), bytes));
        continue;
      }
      size_t copied = 0;
      for (const GradRange& r : grads->ranges()) {
        if (!Inside(r.grads, r.n * element_bytes, bytes)) {
          EXPECT_EQ(r.n, 1u);  // only an element cut between two pieces
          ++copied;
        }
      }
      EXPECT_LT(copied, pieces.size());
    }
  }
}

TEST(PushedGradsTest, TinyPiecesAreCopiedIntoOneRange) {
  std::mt19937 random(7);
  const uint64_t n = 50000;
  const std::string bytes = RandomBytes(n * 2, &random);
  const std::vector<absl::string_view> pieces = CutAnywhere(bytes, 64, &random);
  ASSERT_GT(pieces.size(), bytes.size() / PushedGrads::kMinMeanPieceBytes);
  absl::StatusOr<PushedGrads> grads = PushedGrads::Cut(10, n, 2, pieces);
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_EQ(grads->ranges().size(), 1u);
  EXPECT_FALSE(Inside(grads->ranges()[0].grads, n * 2, bytes));
  EXPECT_EQ(Gather(*grads, 10, n, 2), bytes);
}

TEST(PushedGradsTest, PiecesOfAnotherSizeAreRefused) {
  const std::string bytes(101, 'x');
  const absl::string_view pieces[] = {absl::string_view(bytes).substr(0, 50),
                                      absl::string_view(bytes).substr(50)};
  absl::StatusOr<PushedGrads> grads = PushedGrads::Cut(0, 50, 2, pieces);
  EXPECT_TRUE(absl::IsInvalidArgument(grads.status())) << grads.status();
  EXPECT_NE(grads.status().message().find("grads has 101 bytes"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(PushedGrads::Cut(0, uint64_t{1} << 63, 4, pieces).status()));
}

// Two chunks fed the same steps, one in one piece per push, the other in
// pieces cut anywhere; with a step log.
class PiecesChunkTest : public ::testing::TestWithParam<StatePrecision> {
 protected:
  static constexpr uint64_t kBegin = 4096, kN = 70001;

  std::unique_ptr<Chunk> MakeChunk() {
    auto copy = tier_.Allocate(ChunkCopyBytes(kN, DType::kBf16));
    auto chunk = std::make_unique<Chunk>(
        "job", 1, FlatRange{kBegin, kBegin + kN}, DType::kBf16, AdamConfig{},
        *HostChunkState::Create(&tier_, {kN, GetParam()}), &tier_, *copy);
    std::vector<float> init(kN);
    for (uint64_t i = 0; i < kN; ++i) init[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    EXPECT_TRUE(chunk->WriteParams(kBegin, init.data(), kN).ok());
    return chunk;
  }

  HostTier tier_{uint64_t{64} << 20};
};

TEST_P(PiecesChunkTest, AppliesAsFromOnePiece) {
  std::mt19937 random(testing::TestSeed());
  std::unique_ptr<Chunk> whole = MakeChunk(), cut = MakeChunk();
  std::shared_ptr<StepLog> whole_log = whole->StartStepLog(), cut_log = cut->StartStepLog();
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<uint16_t> g(kN);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    for (uint16_t& x : g) x = FloatToBf16(normal(random));
    const std::string bytes(reinterpret_cast<const char*>(g.data()), kN * 2);
    // Two pushes per step: [kBegin, kBegin + half) and the rest.
    const uint64_t half = 1 + random() % (kN - 1);
    const std::string first = bytes.substr(0, half * 2), rest = bytes.substr(half * 2);
    int answered = 0;
    auto done = [&answered](absl::Status s) {
      EXPECT_TRUE(s.ok()) << s;
      ++answered;
    };
    const StepScalars scalars{0.5f, 1e-3f};
    ASSERT_TRUE(whole->Stage(step, {1}, kBegin, half, first, scalars, done).ok());
    ASSERT_TRUE(*whole->Stage(step, {1}, kBegin + half, kN - half, rest, scalars, done));
    const std::vector<absl::string_view> first_pieces = CutAnywhere(first, 20000, &random);
    const std::vector<absl::string_view> rest_pieces = CutAnywhere(rest, 20000, &random);
    ASSERT_TRUE(cut->Stage(step, {1}, kBegin, half, first_pieces, scalars, done).ok());
    ASSERT_TRUE(*cut->Stage(step, {1}, kBegin + half, kN - half, rest_pieces, scalars, done));
    whole->Apply();
    cut->Apply();
    EXPECT_EQ(answered, 4);
  }
  std::vector<float> p[2], m[2], v[2];
  Chunk* chunks[2] = {whole.get(), cut.get()};
  for (int c = 0; c < 2; ++c) {
    p[c].resize(kN), m[c].resize(kN), v[c].resize(kN);
    EXPECT_EQ(*chunks[c]->ReadState(kBegin, kN, p[c].data(), m[c].data(), v[c].data()), 3);
  }
  EXPECT_EQ(0, std::memcmp(p[0].data(), p[1].data(), kN * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m[0].data(), m[1].data(), kN * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v[0].data(), v[1].data(), kN * sizeof(float)));
  std::string pulled[2];
  for (int c = 0; c < 2; ++c) {
    chunks[c]->Pull(3, kBegin, kN, [&](absl::Status s, int64_t, absl::string_view bytes) {
      EXPECT_TRUE(s.ok()) << s;
      pulled[c] = std::string(bytes);
    });
  }
  EXPECT_EQ(pulled[0].size(), kN * 2);
  EXPECT_EQ(pulled[0], pulled[1]);
  auto whole_steps = whole_log->Read(0, 0), cut_steps = cut_log->Read(0, 0);
  ASSERT_TRUE(whole_steps.ok() && cut_steps.ok());
  ASSERT_EQ(whole_steps->size(), 3u);
  ASSERT_EQ(cut_steps->size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*whole_steps)[i]->grads, (*cut_steps)[i]->grads);
}

INSTANTIATE_TEST_SUITE_P(States, PiecesChunkTest,
                         ::testing::Values(StatePrecision::kFp32, StatePrecision::kInt8));

}  // namespace
}  // namespace strata
