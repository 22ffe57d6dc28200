#include "core/command_line.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace strata {

namespace {

void SetFlagsFromEnvironment(absl::string_view program,
                             absl::Span<const EnvironmentFlag> from_environment) {
  for (const EnvironmentFlag& entry : from_environment) {
    const char* value = std::getenv(entry.variable);
    if (value == nullptr || *value == '\0') continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(entry.flag);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "%s: environment variable %s='%s' (for --%s): %s\n",
                   std::string(program).c_str(), entry.variable, value, entry.flag,
                   flag == nullptr ? "no such flag" : error.c_str());
      std::exit(2);
    }
  }
}

}  // namespace

std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage) {
  return InitCommandLine(argc, argv, usage, {});
}

std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage,
                                         absl::Span<const EnvironmentFlag> from_environment) {
  absl::FlagsUsageConfig config;
  // --help lists the flags that strata's own sources define, not abseil's.
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  // abseil prints "<program>: " before the usage text, which names it too.
  absl::string_view text = usage;
  absl::string_view program = argv[0];
  program = program.substr(program.rfind('/') + 1);
  absl::ConsumePrefix(&text, absl::StrCat(program, ": "));
  absl::SetProgramUsageMessage(text);
  SetFlagsFromEnvironment(program, from_environment);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  return std::vector<std::string>(rest.begin() + 1, rest.end());
}

}  // namespace strata
