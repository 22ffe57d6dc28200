#include "common/log.h"

#include <unistd.h>

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {

void LogEvent(absl::string_view component, absl::string_view message) {
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   component, ": ", message, "\n");
  // One write() per line keeps lines from different threads whole.
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace strata
