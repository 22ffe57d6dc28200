// A copy of a chunk built aside while the chunk trains (CatchUpCopy from
// the chunk's StepLog): pieces read at different steps, each replaying the
// steps logged since, reach the chunk's bits exactly -- p, m, v and the
// low-precision copies of the last two steps -- and then train on as a
// replica of it. FP32 and BF16 gradients, FP32 and 8-bit moments (pushes
// and groups that cut blocks), two parameter groups with their own learning
// rates and weight decays; built aside or in the new copy that lends its
// memory. Random gradients, seed printed.
#include "shard/catch_up_copy.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "shard/chunk.h"
#include "shard/state_math.h"
#include "shard/step_log.h"
#include "storage/host_tier.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

constexpr uint64_t kBegin = 4096;
constexpr uint64_t kN = 1001;           // an 8-bit state of 6038 bytes: not a multiple of 4
constexpr uint64_t kPieceParams = 256;  // pieces of 256, 256, 256 and 233

ChunkGroups TwoGroups() {
  ChunkGroups groups;
  groups.weight_decay = {0.0f, 0.1f};
  groups.spans = {{0, 400, 0}, {400, kN - 400, 1}};
  return groups;
}

v1::ChunkSpec Spec() {
  v1::ChunkSpec spec;
  spec.set_chunk_id(3);
  spec.set_flat_begin(kBegin);
  spec.set_num_params(kN);
  return spec;
}

class CatchUpCopyTest : public ::testing::TestWithParam<std::tuple<DType, StatePrecision>> {
 protected:
  static DType dtype() { return std::get<0>(GetParam()); }
  static StatePrecision precision() { return std::get<1>(GetParam()); }
  static uint64_t StoredBytes(uint64_t n) { return StateBytes(n, precision()); }

  CatchUpCopyTest() : tier_(64 << 20), arena_(0) { rng_.seed(testing::TestSeed()); }

  // A chunk with no state written; its memory made `to_fill` or zeroed.
  std::unique_ptr<Chunk> EmptyChunk(bool to_fill) {
    auto copy = to_fill ? tier_.AllocateToFill(ChunkCopyBytes(kN, dtype()))
                        : tier_.Allocate(ChunkCopyBytes(kN, dtype()));
    EXPECT_TRUE(copy.ok());
    return std::make_unique<Chunk>("job", 3, FlatRange{kBegin, kBegin + kN}, dtype(), AdamConfig{},
                                   *HostChunkState::Create(&tier_, {kN, precision()}, to_fill),
                                   &tier_, *copy, nullptr, 0, TwoGroups());
  }

  std::unique_ptr<Chunk> MakeChunk() {
    std::unique_ptr<Chunk> chunk = EmptyChunk(/*to_fill=*/false);
    std::vector<float> p(kN);
    for (float& x : p) x = std::uniform_real_distribution<float>(-1, 1)(rng_);
    if (initial_.empty()) initial_ = p;
    EXPECT_TRUE(chunk->WriteParams(kBegin, initial_.data(), kN).ok());
    return chunk;
  }

  // A new copy of the chunk as a server allocates it for a seed: no state
  // written, awaiting its seed.
  std::shared_ptr<Chunk> MakeNewCopy() {
    std::shared_ptr<Chunk> chunk = EmptyChunk(/*to_fill=*/true);
    chunk->AwaitSeed();
    return chunk;
  }

  // Step `step` of `chunk` with the gradients `grads` (kept: the chunk
  // keeps views), pushed in two ranges, with per-group learning rates.
  void Train(Chunk& chunk, int64_t step, const std::string& grads) {
    const size_t esize = DTypeSize(dtype());
    StepScalars scalars;
    scalars.coef = 0.5f + 0.01f * static_cast<float>(step);
    scalars.lr = 1e-3f * static_cast<float>(step);
    scalars.group_lrs = {*scalars.lr, 2 * *scalars.lr};
    bool ready = false;
    for (auto [begin, n] : {std::pair<uint64_t, uint64_t>{0, 450}, {450, kN - 450}}) {
      auto staged = chunk.Stage(step, {1}, kBegin + begin, n,
                                absl::string_view(grads).substr(begin * esize, n * esize), scalars,
                                [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
      ASSERT_TRUE(staged.ok()) << staged.status();
      ready = *staged;
    }
    ASSERT_TRUE(ready);
    chunk.Apply();
    ASSERT_EQ(chunk.applied_step(), step);
  }

  // Random gradients of a step, in the dtype, kept for the chunk's views.
  const std::string& Grads() {
    std::vector<float> g(kN);
    std::normal_distribution<float> normal(0, 1);
    for (size_t i = 0; i < kN; ++i) g[i] = normal(rng_) * (i % 3 == 0 ? 10.0f : 1e-3f);
    std::string bytes(kN * DTypeSize(dtype()), '\0');
    CastFromFloat(g.data(), dtype(), bytes.data(), kN);
    grads_.push_back(std::move(bytes));
    return grads_.back();
  }

  // [begin, begin + n) of the chunk's state in its stored form.
  struct State {
    std::string stored;
    int64_t step;
  };
  static State Read(Chunk& chunk, uint64_t begin = kBegin, uint64_t n = kN) {
    State s{std::string(StoredBytes(n), '\0'), -1};
    auto step = chunk.CopyState(begin, n, reinterpret_cast<std::byte*>(s.stored.data()));
    EXPECT_TRUE(step.ok()) << step.status();
    s.step = step.value_or(-1);
    return s;
  }
  static std::string Pulled(Chunk& chunk, int64_t step) {
    std::string out = "not answered";
    chunk.Pull(step, kBegin, kN, [&](absl::Status s, int64_t, absl::string_view bytes) {
      out = s.ok() ? std::string(bytes) : s.ToString();
    });
    return out;
  }
  static void ExpectSameBits(Chunk& a, Chunk& b) {
    const State x = Read(a), y = Read(b);
    EXPECT_EQ(x.step, y.step);
    EXPECT_TRUE(x.stored == y.stored);
    EXPECT_EQ(Pulled(a, x.step), Pulled(b, x.step));
    EXPECT_EQ(Pulled(a, x.step - 1), Pulled(b, x.step - 1));
  }

  void CopyAndTrainOn(std::shared_ptr<Chunk> in_place);

  HostTier tier_;
  StateArena arena_;
  std::mt19937 rng_;
  std::vector<float> initial_;
  std::deque<std::string> grads_;
};

// Builds a copy of a training chunk, in `in_place` (the new copy that
// lends its memory) or else aside, into `replica`; it then trains on with
// the chunk's bits.
void CatchUpCopyTest::CopyAndTrainOn(std::shared_ptr<Chunk> in_place) {
  std::unique_ptr<Chunk> source = MakeChunk();
  int64_t step = 0;
  for (; step < 3; ++step) Train(*source, step + 1, Grads());
  std::shared_ptr<StepLog> log = source->StartStepLog();
  EXPECT_EQ(log->since_step(), 3);
  auto copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(),
                                  kPieceParams, &arena_, in_place);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ((*copy)->in_place(), in_place != nullptr);
  if (in_place != nullptr) {
    EXPECT_EQ(arena_.taken_bytes(), 0u);
  } else {
    EXPECT_GE(arena_.taken_bytes(), StoredBytes(kN));
  }
  if (in_place != nullptr) {
    // Lent, the new copy takes no other write.
    const std::vector<float> zeros(kN);
    EXPECT_EQ(in_place->WriteState(kBegin, zeros.data(), zeros.data(), zeros.data(), kN, 1).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_EQ((*copy)->pieces().size(), 4u);
  // Each piece read one step after the one before: steps 3, 4, 5, 6; the
  // odd ones as a seed reads them, into the piece's spans.
  for (size_t i = 0; i < (*copy)->pieces().size(); ++i) {
    const CatchUpCopy::Piece& piece = (*copy)->pieces()[i];
    const State read = Read(*source, kBegin + piece.offset, piece.n);
    if (i % 2 == 0) {
      ASSERT_TRUE((*copy)->SetPiece(i, read.step, read.stored).ok());
    } else {
      const char* from = read.stored.data();
      for (const absl::Span<std::byte>& span : (*copy)->PieceSpans(i)) {
        std::memcpy(span.data(), from, span.size());
        from += span.size();
      }
      ASSERT_EQ(from, read.stored.data() + read.stored.size());
      (*copy)->PieceRead(i, read.step);
    }
    Train(*source, ++step, Grads());
  }
  Train(*source, ++step, Grads());
  EXPECT_EQ((*copy)->min_step(), 3);
  // A copy whose pieces are at different steps cannot be written.
  std::shared_ptr<Chunk> replica = in_place != nullptr ? in_place : MakeChunk();
  EXPECT_EQ((*copy)->WriteInto(*replica).code(), absl::StatusCode::kFailedPrecondition);
  const size_t esize = DTypeSize(dtype());
  for (size_t i = 0; i < (*copy)->pieces().size(); ++i) {
    const CatchUpCopy::Piece& piece = (*copy)->pieces()[i];
    auto logged = log->Read((*copy)->min_step(), piece.step);
    ASSERT_TRUE(logged.ok()) << logged.status();
    for (const auto& s : *logged) {
      ASSERT_TRUE(
          (*copy)
              ->Replay(i, s->step, s->coef, s->lr, s->group_lrs,
                       absl::string_view(s->grads).substr(piece.offset * esize, piece.n * esize))
              .ok());
    }
    EXPECT_EQ(piece.step, step);
  }
  ASSERT_TRUE((*copy)->WriteInto(*replica).ok());
  EXPECT_FALSE(replica->awaiting_seed());
  copy->reset();  // what the copy held is the replica's alone
  ExpectSameBits(*source, *replica);
  // The replica goes on as a copy of the chunk: the same steps, the same bits.
  for (int k = 0; k < 2; ++k) {
    const std::string& grads = Grads();
    Train(*source, ++step, grads);
    Train(*replica, step, grads);
  }
  ExpectSameBits(*source, *replica);
}

TEST_P(CatchUpCopyTest, PiecesReadAtDifferentStepsReplayToTheChunksBits) {
  CopyAndTrainOn(nullptr);
}

TEST_P(CatchUpCopyTest, ACopyBuiltInItsNewChunkReplaysToTheChunksBits) {
  CopyAndTrainOn(MakeNewCopy());
}

// Only a new copy that awaits its seed lends its memory, to one copy at a
// time; a copy that goes unwritten hands the chunk back as it was lent.
TEST_P(CatchUpCopyTest, OnlyANewCopyLendsItsMemoryAndGetsItBackUnwritten) {
  auto create = [&](std::shared_ptr<Chunk> in_place) {
    auto copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(),
                                    kPieceParams, &arena_, std::move(in_place));
    EXPECT_TRUE(copy.ok()) << copy.status();
    return copy.ok() ? *std::move(copy) : nullptr;
  };
  std::shared_ptr<Chunk> written = MakeChunk();
  EXPECT_FALSE(create(written)->in_place());
  std::shared_ptr<Chunk> fresh = MakeNewCopy();
  {
    std::unique_ptr<CatchUpCopy> first = create(fresh);
    EXPECT_TRUE(first->in_place());
    EXPECT_FALSE(create(fresh)->in_place());
    EXPECT_EQ(fresh->WriteParams(kBegin, initial_.data(), kN).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(fresh->awaiting_seed());
  const std::vector<float> zeros(kN);
  ASSERT_TRUE(fresh->WriteState(kBegin, initial_.data(), zeros.data(), zeros.data(), kN, 2).ok());
  EXPECT_FALSE(create(fresh)->in_place());
  EXPECT_EQ(arena_.taken_bytes(), 0u);
}

TEST_P(CatchUpCopyTest, AStepThatIsNotAPiecesNextIsRefusedAndChangesNothing) {
  std::unique_ptr<Chunk> source = MakeChunk();
  Train(*source, 1, Grads());
  auto copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(),
                                  kPieceParams, &arena_);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const State read = Read(*source, kBegin, kPieceParams);
  EXPECT_EQ((*copy)->SetPiece(0, 1, read.stored.substr(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*copy)->pieces()[0].step, -1);
  ASSERT_TRUE((*copy)->SetPiece(0, 1, read.stored).ok());
  // The copies lie after the state, aligned for the dtype's stores.
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*copy)->previous(0)) % 64, 0u);
  const std::string grads(kPieceParams * DTypeSize(dtype()), '\0');
  EXPECT_EQ((*copy)->Replay(0, 3, 1, 1e-3f, {}, grads).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*copy)->Replay(0, 2, 1, 1e-3f, {}, grads.substr(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*copy)->Replay(0, 2, 1, 1e-3f, {1e-3f}, grads).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*copy)->Replay(1, 1, 1, 1e-3f, {}, grads).code(),
            absl::StatusCode::kInvalidArgument);  // piece 1 was never read
  EXPECT_EQ((*copy)->pieces()[0].step, 1);
  // Written into a chunk at step 1, piece 0 holds what was read.
  ASSERT_TRUE((*copy)->SetPiece(1, 1, Read(*source, kBegin + 256, 256).stored).ok());
  ASSERT_TRUE((*copy)->SetPiece(2, 1, Read(*source, kBegin + 512, 256).stored).ok());
  ASSERT_TRUE((*copy)->SetPiece(3, 1, Read(*source, kBegin + 768, kN - 768).stored).ok());
  std::unique_ptr<Chunk> replica = MakeChunk();
  ASSERT_TRUE((*copy)->WriteInto(*replica).ok());
  EXPECT_TRUE(Read(*replica, kBegin, kPieceParams).stored == read.stored);
}

// Rounded up to the arena's pieces.
uint64_t PieceBytes(uint64_t bytes) {
  return (bytes + StateArena::kAlignment - 1) / StateArena::kAlignment * StateArena::kAlignment;
}

TEST_P(CatchUpCopyTest, ACopyTheArenaHasNoRoomForIsRefused) {
  StateArena small(0, /*limit_bytes=*/4096);
  auto copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(),
                                  kPieceParams, &small);
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted);
  // Room for the state and not the copies: the state goes back.
  StateArena state_only(0, PieceBytes(StoredBytes(kN)));
  copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(), kPieceParams,
                             &state_only);
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(state_only.taken_bytes(), 0u);
}

// A copy's state is a piece of a chunk state's size: once the new chunk's
// saves reserve theirs, the arena counts it and faults nothing in for
// them, and keeps it when the copy goes (its copies of the steps are freed).
TEST_P(CatchUpCopyTest, ACopysStateStaysAsTheMemoryOfItsChunksSaves) {
  StateArena arena(0);
  auto copy = CatchUpCopy::Create(Spec(), dtype(), precision(), AdamConfig{}, TwoGroups(),
                                  kPieceParams, &arena);
  ASSERT_TRUE(copy.ok()) << copy.status();
  const uint64_t allocated = arena.allocated_beyond_bytes();
  EXPECT_EQ(allocated, PieceBytes(StoredBytes(kN)) + PieceBytes(ChunkCopyBytes(kN, dtype())));
  arena.Reserve({StoredBytes(kN)});
  EXPECT_EQ(arena.FaultInReserved().allocated_bytes, 0u);
  copy->reset();
  EXPECT_EQ(arena.held_bytes(), PieceBytes(StoredBytes(kN)));
  absl::StatusOr<std::byte*> save = arena.Take(StoredBytes(kN));
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_EQ(arena.allocated_beyond_bytes(), allocated) << "the save's memory was faulted in anew";
  arena.Give(*save, StoredBytes(kN));
}

// An 8-bit state's stored form covers whole blocks: a range that cuts one
// is refused by name, both ways, and the chunk is unchanged.
TEST_P(CatchUpCopyTest, AStoredRangeMustBeWholeBlocksOf8BitStates) {
  std::unique_ptr<Chunk> chunk = MakeChunk();
  const State whole = Read(*chunk);
  std::string out(StoredBytes(kN), '\0');
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  const absl::StatusCode want = precision() == StatePrecision::kInt8
                                    ? absl::StatusCode::kInvalidArgument
                                    : absl::StatusCode::kOk;
  absl::Status read = chunk->CopyState(kBegin + 100, 100, bytes).status();
  EXPECT_EQ(read.code(), want) << read;
  if (!read.ok()) EXPECT_THAT(read.message(), ::testing::HasSubstr("cuts a block"));
  EXPECT_EQ(chunk->WriteStoredState(kBegin + 100, 100, 0, {}, bytes).code(), want);
  if (precision() == StatePrecision::kInt8) EXPECT_TRUE(Read(*chunk).stored == whole.stored);
  // The last block may end the chunk.
  EXPECT_TRUE(chunk->CopyState(kBegin + 768, kN - 768, bytes).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, CatchUpCopyTest,
    ::testing::Combine(::testing::Values(DType::kFp32, DType::kBf16),
                       ::testing::Values(StatePrecision::kFp32, StatePrecision::kInt8)),
    [](const ::testing::TestParamInfo<std::tuple<DType, StatePrecision>>& info) {
      return absl::StrCat(DTypeName(std::get<0>(info.param)), "_",
                          StatePrecisionName(std::get<1>(info.param)));
    });

// The log's bounds: a reader that falls kMaxSteps behind ends it, and so
// does one that stays away; freed steps are not read again.
TEST(StepLogTest, KeepsTheStepsItsReaderLacksWithinItsBound) {
  StepLog log(10, "chunk 0 of job j");
  auto add = [&](int64_t step) {
    auto s = std::make_shared<LoggedStep>();
    s->step = step;
    s->grads = std::string(8, static_cast<char>(step));
    log.Append(std::move(s));
  };
  for (int64_t step = 11; step <= 13; ++step) add(step);
  auto all = log.Read(/*release_through=*/10, /*after_step=*/10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ(all->back()->step, 13);
  auto read = log.Read(/*release_through=*/11, /*after_step=*/11);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[0]->step, 12);
  // Step 11 is freed: a reader that lacks it gets what is left.
  read = log.Read(10, 10);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->front()->step, 12);
  for (int64_t step = 14; step < 12 + static_cast<int64_t>(StepLog::kMaxSteps); ++step) add(step);
  EXPECT_TRUE(log.status().ok());
  add(12 + StepLog::kMaxSteps);  // one past the bound
  EXPECT_EQ(log.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(log.Read(20, 20).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata
