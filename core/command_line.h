// Command-line set-up shared by every strata binary: the usage message and
// absl flag parsing, with --help listing the binary's own flags, and flags
// that take their value from the environment unless given on the command
// line. Call once, from main, before any other thread starts.
#ifndef STRATA_CORE_COMMAND_LINE_H_
#define STRATA_CORE_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/types/span.h"

namespace strata {

// A flag whose value an environment variable gives when the command line
// does not.
struct EnvironmentFlag {
  const char* flag;      // the flag's name, without dashes
  const char* variable;  // the environment variable
};

// Parses flags (exits after printing --help); returns the positional arguments
// without argv[0].
std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage);

// As above, after setting each flag of `from_environment` to its variable's
// value where that is set and not empty: the command line overrides it.
// Exits with status 2 and a message naming the variable when a value does
// not parse as its flag's type.
std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage,
                                         absl::Span<const EnvironmentFlag> from_environment);

}  // namespace strata

#endif  // STRATA_CORE_COMMAND_LINE_H_
