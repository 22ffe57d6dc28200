// The checkpoint store: a committed checkpoint is listed, a crashed save's
// partial directory is not (and the next save removes it), and pruning keeps
// the newest K -- the bookkeeping of periodic saves, apart from the timing of
// a training job.
#include "coordinator/checkpoint_store.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "strata/internal/records.pb.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class CheckpointStoreTest : public ::testing::Test {
 protected:
  // Commits an empty checkpoint of `step` of job "j"; its path.
  std::string Save(int64_t step) {
    absl::StatusOr<std::string> partial = BeginCheckpoint(dir_, "j", step);
    EXPECT_TRUE(partial.ok()) << partial.status();
    internal::CheckpointManifest manifest;
    manifest.mutable_spec()->set_job_id("j");
    manifest.set_step(step);
    absl::StatusOr<std::string> path = CommitCheckpoint(*partial, manifest);
    EXPECT_TRUE(path.ok()) << path.status();
    return *path;
  }

  std::vector<int64_t> Listed() {
    std::vector<int64_t> steps;
    absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = ListCheckpoints(dir_, "j");
    EXPECT_TRUE(listed.ok()) << listed.status();
    for (const auto& c : *listed) steps.push_back(c.step());
    return steps;
  }

  const testing::ScratchDir scratch_{"checkpoint_store_test"};
  const std::string dir_ = fs::absolute(scratch_.path());
};

TEST_F(CheckpointStoreTest, ListsCommittedOnesAndPrunesAllButTheNewest) {
  for (int64_t step : {20, 5, 15, 10}) EXPECT_EQ(Save(step), CheckpointPath(dir_, "j", step));
  // A save that crashed before its manifest: invisible.
  absl::StatusOr<std::string> crashed = BeginCheckpoint(dir_, "j", 25);
  ASSERT_TRUE(crashed.ok());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{5, 10, 15, 20}));

  ASSERT_TRUE(PruneCheckpoints(dir_, "j", 3).ok());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20}));
  EXPECT_FALSE(fs::exists(CheckpointPath(dir_, "j", 5)));
  EXPECT_TRUE(fs::exists(*crashed));                 // pruning leaves a save in flight alone
  ASSERT_TRUE(PruneCheckpoints(dir_, "j", 0).ok());  // 0: keep all
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20}));

  // The next save removes the crashed one's directory.
  Save(30);
  EXPECT_FALSE(fs::exists(*crashed));
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20, 30}));
}

TEST_F(CheckpointStoreTest, ARelativeDirectoryIsRefused) {
  EXPECT_EQ(BeginCheckpoint("relative/dir", "j", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ListCheckpoints("relative/dir", "j").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
