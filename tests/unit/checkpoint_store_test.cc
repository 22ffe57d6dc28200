// The checkpoint store: a committed checkpoint is listed, a crashed save's
// partial directory is not (and the next save removes it), and pruning keeps
// the newest K -- the bookkeeping of periodic saves, apart from the timing of
// a training job. Every change stays inside the checkpoint root: symlinks
// planted inside it (after a path was checked) are not followed.
#include "coordinator/checkpoint_store.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
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
    absl::StatusOr<std::string> partial = BeginCheckpoint(root_, dir_, "j", step);
    EXPECT_TRUE(partial.ok()) << partial.status();
    internal::CheckpointManifest manifest;
    manifest.mutable_spec()->set_job_id("j");
    manifest.set_step(step);
    absl::StatusOr<std::string> path = CommitCheckpoint(root_, *partial, manifest);
    EXPECT_TRUE(path.ok()) << path.status();
    return *path;
  }

  std::vector<int64_t> Listed() {
    std::vector<int64_t> steps;
    absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = ListCheckpoints(root_, dir_, "j");
    EXPECT_TRUE(listed.ok()) << listed.status();
    for (const auto& c : *listed) steps.push_back(c.step());
    return steps;
  }

  const testing::ScratchDir scratch_{"checkpoint_store_test"};
  const PathRoot root_ = *PathRoot::Open(fs::canonical(scratch_.path()).string() + "/root", "root");
  const std::string dir_ = root_.dir() + "/checkpoints";
};

TEST_F(CheckpointStoreTest, ListsCommittedOnesAndPrunesAllButTheNewest) {
  for (int64_t step : {20, 5, 15, 10}) EXPECT_EQ(Save(step), CheckpointPath(dir_, "j", step));
  // A save that crashed before its manifest: invisible.
  absl::StatusOr<std::string> crashed = BeginCheckpoint(root_, dir_, "j", 25);
  ASSERT_TRUE(crashed.ok());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{5, 10, 15, 20}));

  ASSERT_TRUE(PruneCheckpoints(root_, dir_, "j", 3).ok());
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20}));
  EXPECT_FALSE(fs::exists(CheckpointPath(dir_, "j", 5)));
  EXPECT_TRUE(fs::exists(*crashed));                        // pruning leaves a save in flight alone
  ASSERT_TRUE(PruneCheckpoints(root_, dir_, "j", 0).ok());  // 0: keep all
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20}));

  // The next save removes the crashed one's directory.
  Save(30);
  EXPECT_FALSE(fs::exists(*crashed));
  EXPECT_EQ(Listed(), (std::vector<int64_t>{10, 15, 20, 30}));
}

TEST_F(CheckpointStoreTest, ADirectoryOutsideTheRootIsRefused) {
  for (const std::string& dir : {std::string("relative/dir"), scratch_.path() + "/elsewhere"}) {
    EXPECT_EQ(BeginCheckpoint(root_, dir, "j", 1).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ListCheckpoints(root_, dir, "j").status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ReadCheckpoint(root_, dir).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(fs::exists(scratch_.path() + "/elsewhere"));
}

// Symlinks made inside the root after a directory was resolved -- the
// job's directory, a checkpoint, a chunk file, an old partial directory --
// lead nowhere else: a save is refused rather than writing through them,
// a listing and a restore do not read through them, and removing a crashed
// save's directory removes the link, not what it names.
TEST_F(CheckpointStoreTest, SymlinksInsideTheRootAreNotFollowed) {
  const std::string outside = scratch_.path() + "/outside";
  fs::create_directories(outside + "/step-0000000001");
  {
    std::ofstream keep(outside + "/keep");
    keep << "precious";
  }
  Save(1);
  // A crashed save's directory that is a link to a directory outside.
  fs::create_directory_symlink(outside, dir_ + "/j/.step-9.partial-1");
  Save(2);
  EXPECT_FALSE(fs::exists(dir_ + "/j/.step-9.partial-1"));
  EXPECT_TRUE(fs::exists(outside + "/keep"));

  // The job's directory swapped for a link to a directory outside.
  fs::rename(dir_ + "/j", dir_ + "/j-moved");
  fs::create_directory_symlink(outside, dir_ + "/j");
  absl::StatusOr<std::string> begun = BeginCheckpoint(root_, dir_, "j", 3);
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kFailedPrecondition) << begun.status();
  for (const auto& entry : fs::directory_iterator(outside)) {
    EXPECT_NE(entry.path().filename().string().rfind(".step", 0), 0u)
        << "a partial directory made outside the root: " << entry.path();
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = ListCheckpoints(root_, dir_, "j");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(ReadCheckpoint(root_, dir_ + "/j/step-0000000001").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(PruneCheckpoints(root_, dir_, "j", 1).ok());
  EXPECT_TRUE(fs::exists(outside + "/step-0000000001"));
  fs::remove(dir_ + "/j");
  fs::rename(dir_ + "/j-moved", dir_ + "/j");
  EXPECT_EQ(Listed(), (std::vector<int64_t>{1, 2}));

  // A checkpoint whose chunk file is a link: DATA_LOSS, not a read outside.
  internal::CheckpointManifest manifest;
  manifest.mutable_spec()->set_job_id("j");
  manifest.set_step(4);
  manifest.set_flat_num_params(64);
  v1::CheckpointFile* file = manifest.add_files();
  file->set_file("chunk-00000000.bin");
  file->mutable_chunk()->set_num_params(64);
  file->set_num_bytes(64 * 12);
  {
    std::ofstream big(outside + "/state", std::ios::binary);
    big << std::string(64 * 12, '\0');
  }
  absl::StatusOr<std::string> partial = BeginCheckpoint(root_, dir_, "j", 4);
  ASSERT_TRUE(partial.ok()) << partial.status();
  fs::create_symlink(outside + "/state", *partial + "/chunk-00000000.bin");
  absl::StatusOr<std::string> path = CommitCheckpoint(root_, *partial, manifest);
  ASSERT_TRUE(path.ok()) << path.status();
  absl::StatusOr<internal::CheckpointManifest> read = ReadCheckpoint(root_, *path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(), ::testing::HasSubstr("is not a regular file"));
}

}  // namespace
}  // namespace strata
