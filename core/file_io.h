// POSIX file I/O with absl::Status errors that name the file: whole writes
// and reads that retry short transfers and EINTR. Stateless.
#ifndef STRATA_CORE_FILE_IO_H_
#define STRATA_CORE_FILE_IO_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

// INTERNAL: "<what> <path>: <strerror(errno)>".
absl::Status ErrnoError(absl::string_view what, const std::string& path);
// Writes all `bytes` to `fd`; ErrnoError on failure.
absl::Status WriteFully(int fd, const void* data, size_t bytes, const std::string& path);
// Reads exactly `bytes` from `fd`: DATA_LOSS when the file ends first,
// ErrnoError on failure.
absl::Status ReadFully(int fd, void* data, size_t bytes, const std::string& path);

}  // namespace strata

#endif  // STRATA_CORE_FILE_IO_H_
