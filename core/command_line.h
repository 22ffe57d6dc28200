// Command-line set-up shared by every strata binary: the usage message and
// absl flag parsing, with --help listing the binary's own flags.
#ifndef STRATA_CORE_COMMAND_LINE_H_
#define STRATA_CORE_COMMAND_LINE_H_

#include <string>
#include <vector>

namespace strata {

// Parses flags (exits after printing --help); returns the positional arguments
// without argv[0].
std::vector<std::string> InitCommandLine(int argc, char** argv, const char* usage);

}  // namespace strata

#endif  // STRATA_CORE_COMMAND_LINE_H_
