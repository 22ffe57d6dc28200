// The core helpers that keep hostile request values in bounds: overflow-
// checked sizes, quoted values in messages, paths held inside a root and
// opened beneath it.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/checked_math.h"
#include "core/path_root.h"
#include "core/quoted.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(CheckedMathTest, FlagsEveryWrap) {
  EXPECT_EQ(CheckedAdd(1, 2), 3u);
  EXPECT_EQ(CheckedAdd(~uint64_t{0}, 0), ~uint64_t{0});
  EXPECT_FALSE(CheckedAdd(~uint64_t{0}, 1).has_value());
  EXPECT_EQ(CheckedMul(12, uint64_t{1} << 40), uint64_t{12} << 40);
  EXPECT_EQ(CheckedMul(0, ~uint64_t{0}), 0u);
  // 12 * (2^62 + 16) wraps to 192: the size a hostile num_params once had.
  EXPECT_FALSE(CheckedMul(12, (uint64_t{1} << 62) + 16).has_value());
}

TEST(QuotedTest, CutsLongValuesAndEscapesBytes) {
  EXPECT_EQ(Quoted("job-1"), "'job-1'");
  EXPECT_EQ(Quoted(std::string("a\nb\0z", 5)), "'a\\nb\\x00z'");
  const std::string quoted = Quoted(std::string(1 << 20, 'x'));
  EXPECT_LT(quoted.size(), 100u);
  EXPECT_THAT(quoted, HasSubstr("(1048576 bytes)"));
}

TEST(PathRootTest, ResolvesInsideAndRefusesEverythingElse) {
  const testing::ScratchDir scratch("path_root_test");
  const std::string root_dir = scratch.path() + "/root";
  auto root = PathRoot::Open(root_dir, "checkpoint_root");
  ASSERT_TRUE(root.ok()) << root.status();
  std::filesystem::create_directories(root_dir + "/a/b");
  std::filesystem::create_directories(scratch.path() + "/root-sibling");
  std::filesystem::create_symlink("/etc", root_dir + "/etc-link");
  std::filesystem::create_symlink(root_dir + "/a", root_dir + "/a-link");

  EXPECT_EQ(*root->Resolve(root_dir, "dir"), root->dir());
  EXPECT_EQ(*root->Resolve(root_dir + "/a/b/", "dir"), root->dir() + "/a/b");
  EXPECT_EQ(*root->Resolve(root_dir + "/a/../a/./b", "dir"), root->dir() + "/a/b");
  EXPECT_EQ(*root->Resolve(root_dir + "/a-link/b", "dir"), root->dir() + "/a/b");
  // Not yet existing paths inside are fine (a save makes them).
  EXPECT_EQ(*root->Resolve(root_dir + "/new/x", "dir"), root->dir() + "/new/x");
  for (const std::string& outside :
       {std::string("/etc"), std::string("/"), root_dir + "/..", root_dir + "/a/../../root-sibling",
        scratch.path() + "/root-sibling", root_dir + "/etc-link", root_dir + "/etc-link/passwd"}) {
    absl::StatusOr<std::string> resolved = root->Resolve(outside, "dir");
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_THAT(resolved.status().message(), HasSubstr("is not inside the --checkpoint_root"));
  }
  EXPECT_THAT(root->Resolve("relative/x", "dir").status().message(),
              HasSubstr("is not an absolute path"));
  EXPECT_EQ(root->Resolve(std::string("/x\0y", 4), "dir").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PathRoot::Open("relative", "checkpoint_root").ok());
}

// What Resolve() accepted is opened from the root's directory without
// following a symlink: a directory swapped for a link to outside the root
// after the check leads nowhere (the time-of-check race).
TEST(PathRootTest, OpensBeneathTheRootAndNotThroughALinkMadeAfterTheCheck) {
  const testing::ScratchDir scratch("path_root_beneath_test");
  const std::string root_dir = scratch.path() + "/root";
  const std::string outside = scratch.path() + "/outside";
  auto root = PathRoot::Open(root_dir, "checkpoint_root");
  ASSERT_TRUE(root.ok()) << root.status();
  std::filesystem::create_directories(root_dir + "/job/step");
  std::filesystem::create_directories(outside + "/step");
  std::ofstream(outside + "/step/secret") << "outside";

  absl::StatusOr<std::string> file = root->Resolve(root_dir + "/job/step/secret", "dir");
  ASSERT_TRUE(file.ok()) << file.status();
  const RootedPath rooted(*file, *root);
  int fd = rooted.Open(O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  close(fd);
  EXPECT_TRUE(std::filesystem::exists(root_dir + "/job/step/secret"));
  fd = root->OpenBeneath(root->dir(), O_PATH | O_DIRECTORY);
  EXPECT_GE(fd, 0) << "the root itself";
  if (fd >= 0) close(fd);

  // After the check: job/ becomes a link to a directory outside the root.
  std::filesystem::remove_all(root_dir + "/job");
  std::filesystem::create_symlink(outside, root_dir + "/job");
  for (const int flags : {O_RDONLY, O_WRONLY | O_TRUNC}) {
    fd = rooted.Open(flags);
    EXPECT_EQ(fd, -1) << "opened through the link";
    EXPECT_TRUE(errno == ELOOP || errno == ENOTDIR) << std::strerror(errno);
    if (fd >= 0) close(fd);
  }
  std::ifstream secret(outside + "/step/secret");
  std::string contents;
  secret >> contents;
  EXPECT_EQ(contents, "outside");
  // The last component a link too.
  std::filesystem::create_symlink(outside + "/step/secret", root_dir + "/leaf");
  EXPECT_EQ(root->OpenBeneath(root->dir() + "/leaf", O_RDONLY), -1);
  EXPECT_EQ(errno, ELOOP);
  EXPECT_EQ(root->OpenBeneath("/etc/passwd", O_RDONLY), -1);
  EXPECT_EQ(errno, EINVAL);
  // A plain path opens as open(2) does (the daemons' own files).
  fd = RootedPath(outside + "/step/secret").Open(O_RDONLY);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
}

}  // namespace
}  // namespace strata
