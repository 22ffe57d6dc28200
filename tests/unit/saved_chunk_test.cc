// StateArena carves pieces from its region (first fit, freed pieces
// coalesced) and allocates the others; a chunk state in arena memory
// (ArenaState) is written to its file, with its checksum, as its view holds it.
#include "shard/saved_chunk.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shard/state_arena.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr uint64_t kPage = StateArena::kAlignment;

TEST(StateArenaTest, PiecesComeFromTheRegionFirstFitAndCoalesce) {
  StateArena arena(6 * kPage + 100);  // six whole pages
  EXPECT_EQ(arena.retained_bytes(), 6 * kPage);
  absl::StatusOr<std::byte*> a = arena.Take(5000);  // two pages
  absl::StatusOr<std::byte*> b = arena.Take(2 * kPage);
  absl::StatusOr<std::byte*> c = arena.Take(2 * kPage);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (std::byte* piece : {*a, *b, *c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece) % kPage, 0u);
    std::fill(piece, piece + 2 * kPage, std::byte{7});  // writable, whole
  }
  EXPECT_EQ(*b, *a + 2 * kPage);
  EXPECT_EQ(*c, *b + 2 * kPage);
  EXPECT_EQ(arena.allocated_beyond_bytes(), 0u);

  // The region is full: a piece is allocated beyond it; nothing reserved
  // needs it, so it is freed when given back.
  absl::StatusOr<std::byte*> beyond = arena.Take(100);
  ASSERT_TRUE(beyond.ok());
  EXPECT_EQ(arena.allocated_beyond_bytes(), kPage);
  EXPECT_EQ(arena.taken_bytes(), 7 * kPage);
  arena.Give(*beyond, 100);
  EXPECT_EQ(arena.held_bytes(), 6 * kPage);

  // A freed piece is reused; two freed neighbours make one piece.
  arena.Give(*b, 2 * kPage);
  absl::StatusOr<std::byte*> again = arena.Take(kPage);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *b);
  arena.Give(*again, kPage);
  arena.Give(*a, 5000);
  absl::StatusOr<std::byte*> joined = arena.Take(4 * kPage);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(*joined, *a);
  EXPECT_EQ(arena.allocated_beyond_bytes(), kPage);
  EXPECT_EQ(arena.peak_taken_bytes(), 7 * kPage);
  arena.Give(*joined, 4 * kPage);
  arena.Give(*c, 2 * kPage);
  EXPECT_EQ(arena.taken_bytes(), 0u);
  // All of it coalesced again.
  absl::StatusOr<std::byte*> whole = arena.Take(6 * kPage);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, *a);
  EXPECT_EQ(arena.allocated_beyond_bytes(), kPage);
  arena.Give(*whole, 6 * kPage);
}

// FaultInReserved() allocates, ahead, what the reservations need beyond the
// region, within the limit; the takes then allocate nothing, and the pieces
// are kept between saves. Unreserve() frees what no reservation needs.
TEST(StateArenaTest, ReservedPiecesAreFaultedInAheadAndKeptUntilUnreserved) {
  StateArena arena(2 * kPage, /*limit_bytes=*/9 * kPage);
  const std::vector<uint64_t> job = {2 * kPage, 2 * kPage, 2 * kPage};
  arena.Reserve(job);
  EXPECT_EQ(arena.held_bytes(), 2 * kPage) << "Reserve() allocated";
  EXPECT_EQ(arena.reserved_bytes(), 6 * kPage);
  StateArena::FaultedIn faulted_in = arena.FaultInReserved();
  EXPECT_EQ(faulted_in.allocated_bytes, 4 * kPage);  // the region gives one piece
  EXPECT_EQ(faulted_in.short_bytes, 0u);
  EXPECT_EQ(arena.FaultInReserved().allocated_bytes, 0u);
  EXPECT_EQ(arena.held_bytes(), 6 * kPage);
  for (int save = 0; save < 2; ++save) {
    std::vector<std::byte*> pieces;
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::byte*> piece = arena.Take(2 * kPage);
      ASSERT_TRUE(piece.ok()) << piece.status();
      pieces.push_back(*piece);
    }
    for (std::byte* piece : pieces) arena.Give(piece, 2 * kPage);
    EXPECT_EQ(arena.held_bytes(), 6 * kPage) << "save " << save;
  }
  EXPECT_EQ(arena.allocated_beyond_bytes(), 4 * kPage) << "a take allocated memory";

  // A second job of another size: one piece of three pages fits the limit,
  // the next not.
  const std::vector<uint64_t> other = {3 * kPage, 3 * kPage};
  arena.Reserve(other);
  faulted_in = arena.FaultInReserved();
  EXPECT_EQ(faulted_in.allocated_bytes, 3 * kPage);
  EXPECT_EQ(faulted_in.short_bytes, 3 * kPage);
  EXPECT_EQ(arena.held_bytes(), 9 * kPage);
  // The first job goes: its two pieces are freed, and the second job's
  // missing piece now fits.
  arena.Unreserve(job);
  EXPECT_EQ(arena.held_bytes(), 5 * kPage);
  EXPECT_EQ(arena.FaultInReserved().allocated_bytes, 3 * kPage);
  EXPECT_EQ(arena.held_bytes(), 8 * kPage);
  arena.Unreserve(other);
  EXPECT_EQ(arena.held_bytes(), 2 * kPage);
  EXPECT_EQ(arena.reserved_bytes(), 0u);
  EXPECT_EQ(arena.taken_bytes(), 0u);
}

// A take that neither the region nor a kept piece can give allocates; the
// piece is freed when given back unless a reservation needs it. All the
// arena holds stays within the limit, kept pieces freed to make room.
TEST(StateArenaTest, PiecesBeyondTheRegionAreKeptOnlyForReservationsWithinTheLimit) {
  StateArena arena(2 * kPage, /*limit_bytes=*/5 * kPage);
  arena.Reserve({2 * kPage, 2 * kPage});  // the second piece is beyond the region
  absl::StatusOr<std::byte*> region = arena.Take(2 * kPage);
  absl::StatusOr<std::byte*> beyond = arena.Take(2 * kPage);  // nothing faulted in yet
  ASSERT_TRUE(region.ok() && beyond.ok());
  EXPECT_EQ(arena.held_bytes(), 4 * kPage);
  arena.Give(*beyond, 2 * kPage);
  EXPECT_EQ(arena.held_bytes(), 4 * kPage) << "a reserved piece was not kept";
  absl::StatusOr<std::byte*> reused = arena.Take(2 * kPage);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(*reused, *beyond);
  EXPECT_EQ(arena.allocated_beyond_bytes(), 2 * kPage) << "the kept piece was not reused";
  // Out pieces fill the limit but for one page: a piece of two is refused.
  EXPECT_EQ(arena.Take(2 * kPage).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(arena.refused_bytes(), 2 * kPage);
  // Given back, the kept piece (of another size) is freed to make room.
  arena.Give(*reused, 2 * kPage);
  absl::StatusOr<std::byte*> bigger = arena.Take(3 * kPage);
  ASSERT_TRUE(bigger.ok()) << bigger.status();
  EXPECT_EQ(arena.held_bytes(), 5 * kPage);
  EXPECT_EQ(arena.allocated_beyond_bytes(), 5 * kPage);
  // No reservation needs a piece of three: freed when given back.
  arena.Give(*bigger, 3 * kPage);
  EXPECT_EQ(arena.held_bytes(), 2 * kPage);
  arena.Give(*region, 2 * kPage);
  EXPECT_EQ(arena.taken_bytes(), 0u);
}

class SavedChunkTest : public ::testing::Test {
 protected:
  static std::string Contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  const testing::ScratchDir scratch_{"saved_chunk_test"};
  const std::string& dir_ = scratch_.path();
};

// p, m and v of n parameters whose every float differs from its neighbours.
std::vector<float> State(uint64_t n) {
  std::vector<float> state(3 * n);
  for (uint64_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i) * 0.5f + 0.25f;
  return state;
}

TEST_F(SavedChunkTest, AnArenaStateIsWrittenAsItsViewHoldsIt) {
  StateArena arena(uint64_t{1} << 20);
  // Within the region and beyond it; lengths that are not whole 4 KiB
  // pages (the tail is written without direct I/O) and more than one 8 MiB
  // piece of I/O.
  for (uint64_t n : {uint64_t{1000}, uint64_t{(16 << 20) / 12 + 333}}) {
    SCOPED_TRACE(n);
    const std::vector<float> state = State(n);
    absl::StatusOr<ArenaState> copy = ArenaState::Take(&arena, {n});
    ASSERT_TRUE(copy.ok()) << copy.status();
    copy->CopyFrom(StateView{const_cast<float*>(state.data()), const_cast<float*>(state.data()) + n,
                             const_cast<float*>(state.data()) + 2 * n});
    const StateView view = copy->view();
    EXPECT_EQ(view.m, view.p + n);
    EXPECT_EQ(view.v, view.p + 2 * n);

    absl::StatusOr<uint64_t> checksum = SaveChunkState(dir_ + "/chunk", copy->data(), 12 * n);
    ASSERT_TRUE(checksum.ok()) << checksum.status();
    const std::string bytes = Contents(dir_ + "/chunk");
    ASSERT_EQ(bytes.size(), 12 * n);
    EXPECT_TRUE(bytes == std::string(reinterpret_cast<const char*>(state.data()), 12 * n));

    StateBuffer loaded = AllocateStateBuffer(12 * n);
    ASSERT_TRUE(LoadChunkState(dir_ + "/chunk", *checksum, 12 * n, loaded.get()).ok());
    EXPECT_EQ(std::memcmp(state.data(), loaded.get(), 12 * n), 0);
    EXPECT_EQ(LoadChunkState(dir_ + "/chunk", *checksum + 1, 12 * n, loaded.get()).code(),
              absl::StatusCode::kDataLoss);
  }
  EXPECT_GT(arena.allocated_beyond_bytes(), 0u);
  EXPECT_EQ(arena.taken_bytes(), 0u);
}

TEST_F(SavedChunkTest, AnArenaStateGivesItsMemoryBack) {
  StateArena arena(uint64_t{1} << 20);
  {
    absl::StatusOr<ArenaState> a = ArenaState::Take(&arena, {1000});
    ASSERT_TRUE(a.ok());
    ArenaState moved = *std::move(a);
    EXPECT_FALSE(moved.empty());
    EXPECT_TRUE(a->empty());
    EXPECT_EQ(arena.taken_bytes(), 3 * kPage);  // 12000 bytes
  }
  EXPECT_EQ(arena.taken_bytes(), 0u);
  absl::StatusOr<ArenaState> b = ArenaState::Take(&arena, {1000});
  ASSERT_TRUE(b.ok());
  b->Reset();
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(arena.taken_bytes(), 0u);
  EXPECT_EQ(arena.allocated_beyond_bytes(), 0u);
}

}  // namespace
}  // namespace strata
