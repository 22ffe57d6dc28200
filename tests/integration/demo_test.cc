// The main job as a user runs it: deploy/local-cluster.sh starts the real
// binaries (coordinator, 2 shard servers, 2 trainer processes) on loopback.
// Checks the JSON summary, that the loss decreased, the placement table, and
// that every daemon shut down cleanly on SIGTERM.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/scratch_dir.h"

namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(DemoTest, LocalClusterTrainsAndShutsDownCleanly) {
  const strata::testing::ScratchDir scratch("demo_test");
  const std::string& data = scratch.path();
  std::string command = absl::StrCat("cd ", STRATA_SOURCE_DIR, " && STRATA_BIN=", STRATA_BIN_DIR,
                                     " STEPS=40 bash deploy/local-cluster.sh ", data, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = pclose(pipe);
  ASSERT_EQ(status, 0) << output;

  std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  nlohmann::json summary = nlohmann::json::parse(lines.back());
  EXPECT_EQ(summary["workers"], 2);
  EXPECT_EQ(summary["servers"], 2);
  EXPECT_EQ(summary["steps"], 40);
  EXPECT_LT(summary["loss_last"].get<double>(), 0.7 * summary["loss_first"].get<double>());
  EXPECT_GT(summary["step_ms_median"].get<double>(), 0.0);
  EXPECT_THAT(output, HasSubstr("step   40  loss"));
  EXPECT_THAT(output, HasSubstr("fc1.weight"));
  EXPECT_THAT(output, HasSubstr("host"));

  EXPECT_THAT(ReadFile(data + "/coordinator.log"), HasSubstr("shut down"));
  for (int i = 0; i < 2; ++i) {
    std::string log = ReadFile(absl::StrCat(data, "/server", i, ".log"));
    EXPECT_THAT(log, HasSubstr("received Terminated"));
    EXPECT_THAT(log, HasSubstr("shut down"));
  }
}

}  // namespace
