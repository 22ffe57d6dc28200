// DirFd: an open directory, closed with its DirFd, and what a daemon does
// inside one without following a symlink: open or make a subdirectory,
// list, create, rename and remove entries (a symlink standing where a
// directory was is removed or refused, never followed), sync. Together with
// PathRoot::OpenDirBeneath() it keeps every change to a request's directory
// inside the configured root even while others rename or link inside it.
// Move-only; distinct DirFds may be used from different threads (the file
// system is the shared state).
#ifndef STRATA_CORE_DIR_FD_H_
#define STRATA_CORE_DIR_FD_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

class DirFd {
 public:
  // `fd` (a directory opened O_RDONLY | O_DIRECTORY) named `path` in errors.
  DirFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~DirFd();
  DirFd(DirFd&& other) noexcept;
  DirFd& operator=(DirFd&& other) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // path()/name.
  std::string PathOf(const std::string& name) const;

  // The directory `name` (one component) in this one, made (0755) first
  // when missing and `create`; a symlink there is not followed
  // (FAILED_PRECONDITION, as for any error, naming the path).
  absl::StatusOr<DirFd> Sub(const std::string& name, bool create = false) const;
  // open(2) of `name` in this one with `flags` | O_NOFOLLOW | O_CLOEXEC:
  // -1 and errno as openat(2) leaves them.
  int OpenFile(const std::string& name, int flags, mode_t mode = 0) const;
  // The names of its entries, but "." and "..".
  absl::StatusOr<std::vector<std::string>> List() const;
  // Renames entry `from` to `to` in this directory.
  absl::Status Rename(const std::string& from, const std::string& to) const;
  // Removes entry `name` and, for a directory, everything under it,
  // following no symlink (a symlink is removed, not what it names). OK
  // when `name` is missing.
  absl::Status RemoveTree(const std::string& name) const;
  // fsync(2) of the directory (its entries' names made durable).
  absl::Status Sync() const;

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace strata

#endif  // STRATA_CORE_DIR_FD_H_
