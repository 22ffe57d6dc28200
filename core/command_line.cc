#include "core/command_line.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace strata {

std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage) {
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
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  return std::vector<std::string>(rest.begin() + 1, rest.end());
}

}  // namespace strata
