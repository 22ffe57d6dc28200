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

// The names of the entries of the directory `fd` (then closed), but "."
// and ".."; `path` names it in errors.
absl::StatusOr<std::vector<std::string>> ListAndClose(int fd, const std::string& path) {
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    close(fd);
    return ErrnoError("cannot list", path);
  }
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

// Removes entry `name` of the directory `dir_fd` and, for a directory,
// everything under it, following no symlink; `path` names the entry in
// errors. OK when it is missing.
absl::Status RemoveAt(int dir_fd, const std::string& name, const std::string& path) {
  if (unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EISDIR && errno != EPERM) return ErrnoError("cannot remove", path);
  const int sub = openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return ErrnoError("cannot open", path);
  // The names first: a directory is not changed while it is read.
  const int listed = dup(sub);
  absl::StatusOr<std::vector<std::string>> names =
      listed < 0 ? ErrnoError("cannot list", path) : ListAndClose(listed, path);
  absl::Status status = names.status();
  for (const std::string& entry : names.value_or(std::vector<std::string>())) {
    status.Update(RemoveAt(sub, entry, absl::StrCat(path, "/", entry)));
  }
  close(sub);
  if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    status.Update(ErrnoError("cannot remove", path));
  }
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
  return ListAndClose(fd, path_);
}

absl::Status DirFd::Rename(const std::string& from, const std::string& to) const {
  if (renameat(fd_, from.c_str(), fd_, to.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", PathOf(from), " to"), PathOf(to));
  }
  return absl::OkStatus();
}

absl::Status DirFd::RemoveTree(const std::string& name) const {
  return RemoveAt(fd_, name, PathOf(name));
}

absl::Status DirFd::Sync() const {
  return fsync(fd_) == 0 ? absl::OkStatus() : ErrnoError("cannot sync", path_);
}

}  // namespace strata
