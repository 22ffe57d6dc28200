// One-line event log to stderr: "2026-11-22T08:00:00.123Z component: message".
// Bytes of the message outside printable ASCII are written as \xNN, so that
// an event stays one line whatever a request put into it.
// Thread-safe: each line is written with a single write().
#ifndef STRATA_CORE_LOG_H_
#define STRATA_CORE_LOG_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

void LogEvent(absl::string_view component, absl::string_view message);

// `bytes` for a log line, in the largest unit that keeps it >= 1: "512 B",
// "12 KiB", "384 MiB", "1.5 GiB" (KiB and MiB rounded down).
std::string FormatBytes(uint64_t bytes);

// LogEventCat("server", "job ", id, " created") concatenates its arguments.
template <typename... Args>
void LogEventCat(absl::string_view component, const Args&... args) {
  LogEvent(component, absl::StrCat(args...));
}

}  // namespace strata

#endif  // STRATA_CORE_LOG_H_
