// The main job as a user runs it: deploy/local-cluster.sh starts the real
// binaries (coordinator, 2 shard servers, 2 trainer processes) on loopback.
// Checks the JSON summary, that the loss decreased, the placement table, and
// that every daemon shut down cleanly on SIGTERM. And a long run of it with
// 8-bit optimizer states against one with FP32 states.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// deploy/local-cluster.sh with `environment` (VAR=value ...) and `data` as
// its data directory: its exit status and output.
std::pair<int, std::string> RunLocalCluster(const std::string& environment,
                                            const std::string& data) {
  std::string command =
      absl::StrCat("cd ", STRATA_SOURCE_DIR, " && STRATA_BIN=", STRATA_BIN_DIR, " ", environment,
                   " bash deploy/local-cluster.sh ", data, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  return {pclose(pipe), output};
}

// The loss of every step rank 0 printed ("step N  loss X ...").
std::vector<double> StepLosses(const std::string& output) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    long long step;
    double loss;
    if (std::sscanf(std::string(line).c_str(), "step %lld loss %lf", &step, &loss) == 2) {
      losses.push_back(loss);
    }
  }
  return losses;
}

double MeanOf(const std::vector<double>& x, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += x[i];
  return sum / static_cast<double>(end - begin);
}

TEST(DemoTest, LocalClusterTrainsAndShutsDownCleanly) {
  const strata::testing::ScratchDir scratch("demo_test");
  const std::string& data = scratch.path();
  auto [status, output] = RunLocalCluster("STEPS=40", data);
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

// 2,000 steps (STRATA_LONG_RUN_STEPS: fewer under the sanitizers) with
// 8-bit moments: no divergence (every loss finite, the last tenth's mean
// loss below that of the tenth after the middle) and the final loss (mean of
// the last tenth) within 5% of the same run's with FP32 moments.
TEST(DemoTest, EightBitStatesTrainTheMlpAsFp32StatesDoOver2000Steps) {
  const char* given = std::getenv("STRATA_LONG_RUN_STEPS");
  const size_t kSteps = given != nullptr ? std::strtoul(given, nullptr, 10) : 2000;
  const size_t kWindow = kSteps / 10;
  ASSERT_GE(kWindow, 10u) << "STRATA_LONG_RUN_STEPS " << given;
  std::map<std::string, std::vector<double>> losses;
  for (const std::string state : {"fp32", "int8"}) {
    const strata::testing::ScratchDir scratch("demo_test_" + state);
    auto [status, output] =
        RunLocalCluster(absl::StrCat("STEPS=", kSteps, " STATE=", state), scratch.path());
    ASSERT_EQ(status, 0) << output.substr(output.size() - std::min<size_t>(output.size(), 4000));
    losses[state] = StepLosses(output);
    ASSERT_EQ(losses[state].size(), kSteps) << state;
  }
  for (const double loss : losses["int8"]) ASSERT_TRUE(std::isfinite(loss));
  const double fp32_final = MeanOf(losses["fp32"], kSteps - kWindow, kSteps);
  const double int8_final = MeanOf(losses["int8"], kSteps - kWindow, kSteps);
  const double int8_middle = MeanOf(losses["int8"], kSteps / 2, kSteps / 2 + kWindow);
  std::printf(
      "%zu steps: final loss int8 %.6f, fp32 %.6f (first %.6f); int8 after the middle %.6f\n",
      kSteps, int8_final, fp32_final, losses["fp32"][0], int8_middle);
  EXPECT_LT(int8_final, int8_middle);
  EXPECT_LE(std::fabs(int8_final - fp32_final), 0.05 * fp32_final);
  EXPECT_LT(fp32_final, 0.5 * losses["fp32"][0]);
}

}  // namespace
