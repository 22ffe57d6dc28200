// ChunkCheckpoint: a host-tier chunk's updates go out of place while the
// armed step's buffer is held, and back in place once the save wrote it;
// an NVMe-tier chunk's state is copied aside; without arena memory the
// state is written (here: checksummed) at once, by the step or by the save,
// and the checksum is that of the state as it was.
#include "shard/chunk_checkpoint.h"

#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "shard/saved_chunk.h"

namespace strata {
namespace {

constexpr StateShape kShape{1024, StatePrecision::kFp32};

struct Extent {
  Extent() : bytes(AllocateStateBuffer(kShape.bytes())) {}
  StateView view() const { return kShape.ViewOf(bytes.get()); }
  void Fill(float x) const {
    std::vector<float> values(kShape.bytes() / sizeof(float), x);
    std::memcpy(bytes.get(), values.data(), kShape.bytes());
  }
  StateBuffer bytes;
};

TEST(ChunkCheckpointTest, AHostChunkUpdatesOutOfPlaceWhileItsBufferIsHeld) {
  StateArena arena(/*retained_bytes=*/0);
  Extent extent;
  extent.Fill(1.0f);
  absl::Mutex state_mu;
  absl::MutexLock lock(&state_mu);
  ChunkCheckpoint checkpoint(TierKind::kHost, kShape);
  checkpoint.Arm(&arena, RootedPath());
  EXPECT_FALSE(checkpoint.kept());
  ASSERT_TRUE(checkpoint.Keep(checkpoint.LiveView(extent.view())).ok());
  EXPECT_TRUE(checkpoint.kept());
  EXPECT_TRUE(checkpoint.holds_buffer());

  absl::Status failure;
  const StateView out = checkpoint.UpdateTarget(extent.view(), state_mu, &failure);
  ASSERT_TRUE(failure.ok()) << failure;
  ASSERT_NE(out.bytes(), extent.view().bytes());  // the shadow
  std::memset(out.bytes(), 0, kShape.bytes());
  checkpoint.Updated(out);
  EXPECT_EQ(checkpoint.LiveView(extent.view()).bytes(), out.bytes());
  // The next update, the extent still held: in the shadow again.
  EXPECT_EQ(checkpoint.UpdateTarget(extent.view(), state_mu, &failure).bytes(), out.bytes());

  ArenaState copy;
  absl::StatusOr<const std::byte*> saved = checkpoint.BeginSave(extent.view(), &copy);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*saved, extent.view().bytes());  // the held step's state, unchanged
  EXPECT_TRUE(checkpoint.writing());
  EXPECT_EQ(ChecksumChunkState(*saved, kShape.bytes()), [] {
    Extent ones;
    ones.Fill(1.0f);
    return ChecksumChunkState(ones.bytes.get(), kShape.bytes());
  }());
  checkpoint.EndSave();
  EXPECT_FALSE(checkpoint.writing());
  EXPECT_FALSE(checkpoint.holds_buffer());
  // The extent is free: the update after goes back to it.
  EXPECT_EQ(checkpoint.UpdateTarget(extent.view(), state_mu, &failure).bytes(),
            extent.view().bytes());
}

TEST(ChunkCheckpointTest, AnNvmeChunkCopiesItsStateAside) {
  StateArena arena(/*retained_bytes=*/0);
  Extent state;
  state.Fill(2.0f);
  ChunkCheckpoint checkpoint(TierKind::kNvme, kShape);
  checkpoint.Arm(&arena, RootedPath());
  ASSERT_TRUE(checkpoint.Keep(state.view()).ok());
  EXPECT_TRUE(checkpoint.kept());
  EXPECT_FALSE(checkpoint.holds_buffer());
  const uint64_t before = ChecksumChunkState(state.bytes.get(), kShape.bytes());
  state.Fill(3.0f);  // the steps after change the tier's state
  ArenaState copy;
  absl::StatusOr<const std::byte*> saved = checkpoint.BeginSave(state.view(), &copy);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(ChecksumChunkState(*saved, kShape.bytes()), before);
  checkpoint.EndSave();
  EXPECT_FALSE(checkpoint.kept());
}

TEST(ChunkCheckpointTest, WithoutArenaMemoryTheStateIsWrittenAtOnce) {
  StateArena arena(/*retained_bytes=*/0, /*limit_bytes=*/0);
  Extent extent;
  extent.Fill(4.0f);
  const uint64_t before = ChecksumChunkState(extent.bytes.get(), kShape.bytes());
  absl::Mutex state_mu;
  absl::MutexLock lock(&state_mu);
  for (TierKind tier : {TierKind::kHost, TierKind::kNvme}) {
    ChunkCheckpoint checkpoint(tier, kShape);
    checkpoint.Arm(&arena, RootedPath());
    ASSERT_TRUE(checkpoint.Keep(extent.view()).ok());
    absl::Status failure;
    // No shadow: the held state is written, and the update goes in place.
    EXPECT_EQ(checkpoint.UpdateTarget(extent.view(), state_mu, &failure).bytes(),
              extent.view().bytes());
    EXPECT_TRUE(failure.ok()) << failure;
    EXPECT_FALSE(checkpoint.holds_buffer());
    EXPECT_EQ(checkpoint.TakeWritten().value_or(0), before) << TierKindName(tier);
    EXPECT_FALSE(checkpoint.TakeWritten().has_value());
  }
}

TEST(ChunkCheckpointTest, ASaveWithoutArenaMemoryForACopyWritesTheStateAtOnce) {
  StateArena arena(/*retained_bytes=*/0, /*limit_bytes=*/0);
  Extent state;
  state.Fill(5.0f);
  ChunkCheckpoint checkpoint(TierKind::kNvme, kShape);
  checkpoint.Arm(&arena, RootedPath());
  // The chunk was at the armed step already: no step kept a copy.
  EXPECT_FALSE(checkpoint.kept());
  ArenaState copy;
  absl::StatusOr<const std::byte*> saved = checkpoint.BeginSave(state.view(), &copy);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*saved, nullptr);
  EXPECT_TRUE(copy.empty());
  EXPECT_EQ(checkpoint.TakeWritten().value_or(0),
            ChecksumChunkState(state.bytes.get(), kShape.bytes()));
  EXPECT_FALSE(checkpoint.TakeWritten().has_value());
}

}  // namespace
}  // namespace strata
