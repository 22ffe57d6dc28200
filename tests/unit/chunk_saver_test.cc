// SaveArmedChunks: every armed chunk's state at its step, written while
// training goes on, or on an error every chunk disarmed and the file named.
#include "shard/chunk_saver.h"

#include <unistd.h>

#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"
#include "shard/saved_chunk.h"
#include "storage/host_tier.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr uint64_t kN = 5000;  // not a multiple of the 4 KiB block
constexpr int kChunks = 5;

class ChunkSaverTest : public ::testing::Test {
 protected:
  ChunkSaverTest() : tier_(uint64_t{16} << 20), chunks_(MakeChunks()) {
    std::filesystem::create_directories(dir_);
    for (int i = 0; i < kChunks; ++i) paths_.push_back(dir_ + "/chunk-" + std::to_string(i));
  }

  std::vector<std::shared_ptr<Chunk>> MakeChunks() {
    std::vector<std::shared_ptr<Chunk>> chunks;
    for (int i = 0; i < kChunks; ++i) {
      const FlatRange range{i * kN, (i + 1) * kN};
      auto copy = tier_.Allocate(ChunkCopyBytes(kN, DType::kFp16));
      chunks.push_back(std::make_shared<Chunk>("job", i, range, DType::kFp16, AdamConfig{},
                                               *HostChunkState::Create(&tier_, {kN}), &tier_,
                                               *copy));
      std::vector<float> init(kN);
      for (uint64_t j = 0; j < kN; ++j) init[j] = 0.001f * static_cast<float>(j + i);
      EXPECT_TRUE(chunks.back()->WriteParams(range.begin, init.data(), kN).ok());
    }
    return chunks;
  }

  // Arms every chunk for `step`, chunk i to be written to paths_[i].
  void Arm(int64_t step, StateArena* arena) {
    for (int i = 0; i < kChunks; ++i) {
      ASSERT_TRUE(chunks_[i]->ArmCheckpoint(step, arena, paths_[i]).ok()) << "chunk " << i;
    }
  }

  // Saves the armed chunks: file i must hold want[i], every chunk disarmed.
  void SaveAndExpect(const std::vector<std::vector<float>>& want) {
    absl::StatusOr<std::vector<SavedChunk>> saved = SaveArmedChunks(chunks_);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->size(), kChunks);
    for (int i = 0; i < kChunks; ++i) {
      std::vector<float> got(3 * kN);
      ASSERT_TRUE(LoadChunkState(paths_[i], (*saved)[i].checksum, 12 * kN,
                                 reinterpret_cast<std::byte*>(got.data()))
                      .ok())
          << "chunk " << i;
      EXPECT_TRUE(got == want[i]) << "chunk " << i << " was not saved at its armed step";
      EXPECT_EQ(chunks_[i]->AwaitCheckpointStep(absl::InfinitePast()).code(),
                absl::StatusCode::kFailedPrecondition)
          << "chunk " << i << " is still armed";
    }
  }

  // Pushes and applies the next step on every chunk.
  void Step(int64_t step) { Step(chunks_, step); }
  static void Step(const std::vector<std::shared_ptr<Chunk>>& chunks, int64_t step) {
    std::vector<uint16_t> grads(kN, FloatToHalf(0.01f * static_cast<float>(step)));
    const std::string bytes(reinterpret_cast<const char*>(grads.data()), grads.size() * 2);
    for (const auto& chunk : chunks) {
      auto staged = chunk->Stage(step, {1}, chunk->range().begin, kN, bytes, StepScalars{1.0f},
                                 [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
      ASSERT_TRUE(staged.ok() && *staged) << staged.status();
      chunk->Apply();
    }
  }

  // p, m, v of every chunk now, as a file would hold them.
  std::vector<std::vector<float>> States() { return States(chunks_); }
  static std::vector<std::vector<float>> States(const std::vector<std::shared_ptr<Chunk>>& chunks) {
    std::vector<std::vector<float>> states;
    for (const auto& chunk : chunks) {
      std::vector<float> pmv(3 * kN);
      float* p = pmv.data();
      EXPECT_TRUE(chunk->ReadState(chunk->range().begin, kN, p, p + kN, p + 2 * kN).ok());
      states.push_back(std::move(pmv));
    }
    return states;
  }

  HostTier tier_;
  // Room for two chunk states: the others' are allocated beyond it.
  StateArena arena_{2 * 61440};
  const testing::ScratchDir scratch_{"chunk_saver_test"};
  const std::string& dir_ = scratch_.path();
  const std::vector<std::shared_ptr<Chunk>> chunks_;
  std::vector<std::string> paths_;
};

TEST_F(ChunkSaverTest, WritesEveryChunkAtItsArmedStepWhileLaterStepsApply) {
  Step(1);
  const std::vector<std::vector<float>> want = States();
  Arm(1, &arena_);
  // Chunks 0 to 2 apply step 2 before the save: into second buffers, two
  // from the arena's region and one beyond it; 3 and 4 are written from
  // their live state.
  for (int i = 0; i < 3; ++i) {
    std::vector<uint16_t> grads(kN, FloatToHalf(-0.5f));
    const std::string bytes(reinterpret_cast<const char*>(grads.data()), grads.size() * 2);
    ASSERT_TRUE(*chunks_[i]->Stage(2, {1}, chunks_[i]->range().begin, kN, bytes, StepScalars{1.0f},
                                   [](absl::Status) {}));
    chunks_[i]->Apply();
  }

  SaveAndExpect(want);
  if (HasFatalFailure()) return;
  EXPECT_EQ(arena_.allocated_beyond_bytes(), 61440u);
  EXPECT_EQ(arena_.peak_taken_bytes(), 3 * 61440u);
  // The next steps move the state back; every second buffer goes back.
  for (int i = 3; i < kChunks; ++i) {
    std::vector<uint16_t> grads(kN, FloatToHalf(-0.5f));
    const std::string bytes(reinterpret_cast<const char*>(grads.data()), grads.size() * 2);
    ASSERT_TRUE(*chunks_[i]->Stage(2, {1}, chunks_[i]->range().begin, kN, bytes, StepScalars{1.0f},
                                   [](absl::Status) {}));
    chunks_[i]->Apply();
  }
  Step(3);
  EXPECT_EQ(arena_.taken_bytes(), 0u);
}

TEST_F(ChunkSaverTest, AFailedWriteNamesTheFileAndDisarmsEveryChunk) {
  Step(1);
  paths_[1] = dir_ + "/missing/chunk-1";
  Arm(1, &arena_);
  absl::StatusOr<std::vector<SavedChunk>> saved = SaveArmedChunks(chunks_);
  ASSERT_FALSE(saved.ok());
  EXPECT_NE(saved.status().message().find(paths_[1]), std::string::npos) << saved.status();
  for (int i = 0; i < kChunks; ++i) {
    EXPECT_EQ(chunks_[i]->AwaitCheckpointStep(absl::InfinitePast()).code(),
              absl::StatusCode::kFailedPrecondition)
        << "chunk " << i << " is still armed";
  }
  // Training and the next save go on.
  Step(2);
  paths_[1] = dir_ + "/chunk-1";
  Arm(2, &arena_);
  EXPECT_TRUE(SaveArmedChunks(chunks_).ok());
}

// With memory for one second buffer, the other chunks' steps past the armed
// one write its state themselves before they update in place: the files and
// the training's state are as with memory enough, and nothing is left out.
TEST_F(ChunkSaverTest, WhenTheArenaIsFullAStepWritesTheArmedStateBeforeItUpdates) {
  const std::vector<std::shared_ptr<Chunk>> control = MakeChunks();
  Step(1);
  Step(control, 1);
  const std::vector<std::vector<float>> want = States();
  StateArena full(/*retained_bytes=*/0, /*limit_bytes=*/61440);
  Arm(1, &full);
  Step(2);  // chunk 0 into a second buffer; 1-4 refused one
  Step(control, 2);
  EXPECT_EQ(full.refused_bytes(), (kChunks - 1) * 61440u);
  EXPECT_TRUE(States() == States(control)) << "training's state differs from in-place updates";

  SaveAndExpect(want);
  if (HasFatalFailure()) return;
  Step(3);
  Step(control, 3);
  EXPECT_TRUE(States() == States(control));
  EXPECT_EQ(full.taken_bytes(), 0u);
}

}  // namespace
}  // namespace strata
