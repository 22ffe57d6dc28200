// The core helpers that keep hostile request values in bounds: overflow-
// checked sizes, quoted values in messages, paths held inside a root.
#include <filesystem>
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

}  // namespace
}  // namespace strata
