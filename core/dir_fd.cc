#include "core/dir_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/file_io.h"

namespace strata {
namespace {

// Removes everything in the directory `fd` (then closed), following no
// symlink; `path` names it in errors.
absl::Status RemoveContents(int fd, const std::string& path) {
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return ErrnoError("cannot list", path);
  }
  absl::Status status;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (unlinkat(fd, name.c_str(), 0) == 0) continue;
    if (errno != EISDIR && errno != EPERM) {
      status.Update(ErrnoError("cannot remove", absl::StrCat(path, "/", name)));
      continue;
    }
    const int sub = openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      status.Update(ErrnoError("cannot open", absl::StrCat(path, "/", name)));
      continue;
    }
    status.Update(RemoveContents(sub, absl::StrCat(path, "/", name)));
    if (unlinkat(fd, name.c_str(), AT_REMOVEDIR) != 0) {
      status.Update(ErrnoError("cannot remove", absl::StrCat(path, "/", name)));
    }
  }
  closedir(dir);
  return status;
}

}  // namespace

DirFd::~DirFd() {
  if (fd_ >= 0) close(fd_);
}

DirFd::DirFd(DirFd&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DirFd& DirFd::operator=(DirFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

std::string DirFd::PathOf(const std::string& name) const {
  return path_ == "/" ? absl::StrCat("/", name) : absl::StrCat(path_, "/", name);
}

absl::StatusOr<DirFd> DirFd::Sub(const std::string& name, bool create) const {
  if (create && mkdirat(fd_, name.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", PathOf(name), ": ", std::strerror(errno)));
  }
  const int fd = openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open directory ", PathOf(name), ": ", std::strerror(errno)));
  }
  return DirFd(fd, PathOf(name));
}

int DirFd::OpenFile(const std::string& name, int flags, mode_t mode) const {
  return openat(fd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

absl::StatusOr<std::vector<std::string>> DirFd::List() const {
  // fdopendir takes the descriptor it is given: a second one for it.
  const int fd = openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot list", path_);
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return ErrnoError("cannot list", path_);
  }
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

absl::Status DirFd::Rename(const std::string& from, const std::string& to) const {
  if (renameat(fd_, from.c_str(), fd_, to.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", PathOf(from), " to"), PathOf(to));
  }
  return absl::OkStatus();
}

absl::Status DirFd::RemoveTree(const std::string& name) const {
  if (unlinkat(fd_, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EISDIR && errno != EPERM) return ErrnoError("cannot remove", PathOf(name));
  const int sub = openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return ErrnoError("cannot open", PathOf(name));
  absl::Status status = RemoveContents(sub, PathOf(name));
  if (unlinkat(fd_, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    status.Update(ErrnoError("cannot remove", PathOf(name)));
  }
  return status;
}

absl::Status DirFd::Sync() const {
  return fsync(fd_) == 0 ? absl::OkStatus() : ErrnoError("cannot sync", path_);
}

}  // namespace strata
