#include "core/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteFully(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("cannot write", path);
    p += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status ReadFully(int fd, void* data, size_t bytes, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", path);
    if (n == 0) return absl::DataLossError(absl::StrCat(path, " is truncated"));
    p += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

}  // namespace strata
