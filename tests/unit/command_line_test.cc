// InitCommandLine with flags from the environment: a variable gives a flag
// the command line leaves out, the command line wins, an empty variable is
// no value, and a value that does not parse stops the program naming it.
#include "core/command_line.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, test_steps, 1, "a number the environment may give");
ABSL_FLAG(std::string, test_name, "default", "a string the environment may give");
ABSL_FLAG(std::string, test_label, "default", "a string left to its default");

namespace strata {
namespace {

constexpr EnvironmentFlag kFromEnvironment[] = {{"test_steps", "STRATA_TEST_STEPS"},
                                                {"test_name", "STRATA_TEST_NAME"},
                                                {"test_label", "STRATA_TEST_LABEL"}};

std::vector<std::string> Init(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  return InitCommandLine(static_cast<int>(args.size()), argv.data(), "command_line_test: usage",
                         kFromEnvironment);
}

TEST(CommandLineTest, TheEnvironmentGivesWhatTheCommandLineDoesNot) {
  setenv("STRATA_TEST_STEPS", "7", 1);
  setenv("STRATA_TEST_NAME", "from-environment", 1);
  setenv("STRATA_TEST_LABEL", "", 1);
  const std::vector<std::string> rest =
      Init({"command_line_test", "--test_name=from-flag", "positional"});
  EXPECT_EQ(absl::GetFlag(FLAGS_test_steps), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "from-flag");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_label), "default");
  EXPECT_THAT(rest, ::testing::ElementsAre("positional"));
}

TEST(CommandLineDeathTest, AValueThatDoesNotParseNamesItsVariable) {
  EXPECT_EXIT(
      {
        setenv("STRATA_TEST_STEPS", "seven", 1);
        Init({"command_line_test"});
      },
      ::testing::ExitedWithCode(2), "STRATA_TEST_STEPS='seven' \\(for --test_steps\\)");
}

}  // namespace
}  // namespace strata
