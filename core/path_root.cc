#include "core/path_root.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/quoted.h"
#include "core/status_macros.h"

namespace strata {

struct PathRoot::Descriptor {
  explicit Descriptor(int fd) : fd(fd) {}
  ~Descriptor() { close(fd); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  const int fd;
};

absl::StatusOr<PathRoot> PathRoot::Open(const std::string& dir, absl::string_view flag) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(dir), " must be an absolute directory"));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::filesystem::path canonical = std::filesystem::canonical(dir, error);
  if (error || !std::filesystem::is_directory(canonical)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(dir),
                     " is not a usable directory: ", error ? error.message() : "not a directory"));
  }
  const int fd = open(canonical.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(dir), " cannot be opened: ", std::strerror(errno)));
  }
  return PathRoot(canonical.string(), std::string(flag), std::make_shared<const Descriptor>(fd));
}

bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name.find('/') == absl::string_view::npos && name != "." && name != "..";
}

std::optional<std::vector<std::string>> PathRoot::NamesBeneath(const std::string& resolved) const {
  const std::string prefix = dir_ == "/" ? "/" : dir_ + "/";
  if (resolved != dir_ && !absl::StartsWith(resolved, prefix)) return std::nullopt;
  const std::vector<std::string> names =
      absl::StrSplit(absl::string_view(resolved).substr(std::min(resolved.size(), prefix.size())),
                     '/', absl::SkipEmpty());
  for (const std::string& name : names) {
    if (!IsPlainFileName(name)) return std::nullopt;
  }
  return names;
}

absl::StatusOr<DirFd> PathRoot::OpenDirBeneath(const std::string& resolved, bool create) const {
  const std::optional<std::vector<std::string>> names = NamesBeneath(resolved);
  if (!names.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quoted(resolved), " is not inside the --", flag_, " ", dir_));
  }
  const int fd = openat(fd_->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open directory ", dir_, ": ", std::strerror(errno)));
  }
  DirFd at(fd, dir_);
  for (const std::string& name : *names) {
    ASSIGN_OR_RETURN(at, at.Sub(name, create));
  }
  return at;
}

int PathRoot::OpenBeneath(const std::string& resolved, int flags, mode_t mode) const {
  const std::optional<std::vector<std::string>> found = NamesBeneath(resolved);
  if (!found.has_value()) {
    errno = EINVAL;
    return -1;
  }
  const std::vector<std::string>& names = *found;
  if (names.empty()) return openat(fd_->fd, ".", flags | O_CLOEXEC, mode);
  int at = fd_->fd;
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    const int next = openat(at, names[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int error = errno;
    if (at != fd_->fd) close(at);
    if (next < 0) {
      errno = error;
      return -1;
    }
    at = next;
  }
  const int fd = openat(at, names.back().c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  const int error = errno;
  if (at != fd_->fd) close(at);
  errno = error;
  return fd;
}

int RootedPath::Open(int flags, mode_t mode) const {
  if (root_.has_value()) return root_->OpenBeneath(path_, flags, mode);
  return open(path_.c_str(), flags | O_CLOEXEC, mode);
}

absl::StatusOr<std::string> PathRoot::Resolve(absl::string_view path,
                                              absl::string_view field) const {
  if (path.empty() || path[0] != '/' || path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", Quoted(path), " is not an absolute path"));
  }
  std::error_code error;
  std::string resolved =
      std::filesystem::weakly_canonical(std::filesystem::path(std::string(path)), error)
          .lexically_normal()
          .string();
  // weakly_canonical keeps the input's trailing slash.
  if (resolved.size() > 1 && resolved.back() == '/') resolved.pop_back();
  const bool inside =
      !error && (resolved == dir_ || absl::StartsWith(resolved, dir_ == "/" ? "/" : dir_ + "/"));
  if (!inside) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", Quoted(path), " is not inside the --", flag_, " ", dir_));
  }
  return resolved;
}

}  // namespace strata
