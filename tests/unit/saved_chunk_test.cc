// BlockPool keeps its blocks for reuse and frees the others; a chunk state
// copied into blocks (BlockedState) is written to the same file, with the
// same checksum, as the same state in one buffer, whatever the blocks'
// boundaries cut.
#include "server/saved_chunk.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/block_pool.h"

namespace strata {
namespace {

constexpr size_t kBlock = BlockPool::kBlockBytes;

TEST(BlockPoolTest, KeptBlocksAreReusedAndOthersFreed) {
  BlockPool pool(2 * kBlock + kBlock / 2);  // two whole blocks
  EXPECT_EQ(pool.retained_bytes(), 2 * kBlock);
  // Two kept blocks and a third allocated for the last 5000 bytes: 8 KiB.
  const uint64_t bytes = 2 * kBlock + 5000;
  absl::StatusOr<std::vector<std::byte*>> first = pool.Take(bytes);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 3u);
  for (size_t i = 0; i < first->size(); ++i) {
    std::byte* block = (*first)[i];
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 4096, 0u);
    std::fill(block, block + (i < 2 ? kBlock : 8192), std::byte{7});  // writable
  }
  EXPECT_EQ(pool.peak_taken_bytes(), 2 * kBlock + 8192);
  EXPECT_EQ(pool.allocated_beyond_bytes(), 8192u);
  pool.Give(*first, bytes);

  // The two kept blocks come back first; the third was freed.
  absl::StatusOr<std::vector<std::byte*>> again = pool.Take(2 * kBlock);
  ASSERT_TRUE(again.ok());
  std::vector<std::byte*> kept(first->begin(), first->begin() + 2);
  std::vector<std::byte*> got = *again;
  std::sort(kept.begin(), kept.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, kept);
  EXPECT_EQ(pool.allocated_beyond_bytes(), 8192u);

  // With the kept blocks out, a small state gets a small block.
  absl::StatusOr<std::vector<std::byte*>> small = pool.Take(100);
  ASSERT_TRUE(small.ok());
  ASSERT_EQ(small->size(), 1u);
  EXPECT_EQ(pool.peak_taken_bytes(), 2 * kBlock + 8192);
  EXPECT_EQ(pool.allocated_beyond_bytes(), 8192u + 4096u);
  pool.Give(*small, 100);
  pool.Give(*again, 2 * kBlock);
}

class SavedChunkTest : public ::testing::Test {
 protected:
  ~SavedChunkTest() override { std::filesystem::remove_all(dir_); }

  static std::string Contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  const std::string dir_ = [] {
    std::string dir = ::testing::TempDir() + "/saved_chunk_test_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    return dir;
  }();
};

// p, m and v of n parameters whose every float differs from its neighbours.
std::vector<float> State(uint64_t n) {
  std::vector<float> state(3 * n);
  for (uint64_t i = 0; i < state.size(); ++i) state[i] = static_cast<float>(i) * 0.5f + 0.25f;
  return state;
}

TEST_F(SavedChunkTest, BlocksAreWrittenAsOneBufferWouldBe) {
  BlockPool pool(kBlock);  // one kept block; the others are allocated
  // 12n bytes: 1 block, 2 blocks with m and v crossing block boundaries,
  // and lengths that are not whole 4 KiB blocks (the tail is written
  // without direct I/O).
  for (uint64_t n : {uint64_t{1000}, uint64_t{(2 * kBlock) / 12 + 333}, uint64_t{kBlock / 4}}) {
    SCOPED_TRACE(n);
    const std::vector<float> state = State(n);
    absl::StatusOr<BlockedState> blocked = BlockedState::Take(&pool, n);
    ASSERT_TRUE(blocked.ok()) << blocked.status();
    EXPECT_EQ(blocked->blocks().size(), (12 * n + kBlock - 1) / kBlock);
    blocked->CopyFrom(StateView{const_cast<float*>(state.data()),
                                const_cast<float*>(state.data()) + n,
                                const_cast<float*>(state.data()) + 2 * n});

    StateBuffer buffer = AllocateStateBuffer(n);
    std::copy(state.begin(), state.end(), buffer.get());
    absl::StatusOr<uint64_t> want = SaveChunkState(dir_ + "/buffer", buffer.get(), n);
    absl::StatusOr<uint64_t> got = SaveChunkState(dir_ + "/blocks", *blocked);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want);
    const std::string bytes = Contents(dir_ + "/blocks");
    ASSERT_EQ(bytes.size(), 12 * n);
    EXPECT_TRUE(bytes == std::string(reinterpret_cast<const char*>(state.data()), 12 * n));

    StateBuffer loaded = AllocateStateBuffer(n);
    ASSERT_TRUE(LoadChunkState(dir_ + "/blocks", *got, n, loaded.get()).ok());
    EXPECT_TRUE(std::equal(state.begin(), state.end(), loaded.get()));
    EXPECT_EQ(LoadChunkState(dir_ + "/blocks", *got + 1, n, loaded.get()).code(),
              absl::StatusCode::kDataLoss);
  }
  EXPECT_GT(pool.allocated_beyond_bytes(), 0u);
}

TEST_F(SavedChunkTest, ABlockedStateGivesItsBlocksBack) {
  BlockPool pool(kBlock);
  {
    absl::StatusOr<BlockedState> a = BlockedState::Take(&pool, 1000);
    ASSERT_TRUE(a.ok());
    BlockedState moved = *std::move(a);
    EXPECT_FALSE(moved.empty());
    EXPECT_TRUE(a->empty());
    EXPECT_EQ(pool.peak_taken_bytes(), kBlock);
  }
  // Given back: taking it again allocates nothing new.
  absl::StatusOr<BlockedState> b = BlockedState::Take(&pool, 1000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.allocated_beyond_bytes(), 0u);
  b->Reset();
  EXPECT_TRUE(b->empty());
}

}  // namespace
}  // namespace strata
