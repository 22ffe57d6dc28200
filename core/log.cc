#include "core/log.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {
namespace {

// `text` with every byte outside printable ASCII as \xNN.
std::string PrintableAscii(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    }
  }
  return out;
}

}  // namespace

void LogEvent(absl::string_view component, absl::string_view message) {
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   PrintableAscii(component), ": ", PrintableAscii(message), "\n");
  // One write() per line keeps lines from different threads whole.
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < (uint64_t{1} << 10)) return absl::StrCat(bytes, " B");
  if (bytes < (uint64_t{1} << 20)) return absl::StrCat(bytes >> 10, " KiB");
  if (bytes < (uint64_t{1} << 30)) return absl::StrCat(bytes >> 20, " MiB");
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (uint64_t{1} << 30));
}

}  // namespace strata
