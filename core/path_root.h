// PathRoot: a directory a daemon was configured with, inside which every
// directory or file named by a request must lie. Resolve() canonicalizes a
// requested path (`..`, `.`, repeated slashes, and symlinks of the part that
// exists) and refuses what lands outside the root; OpenBeneath() then opens
// what it resolved from the root's directory, following no symlink, so that
// a symlink or rename made inside the root after the check leads nowhere
// else (OpenDirBeneath: a directory, to change with core/dir_fd.h).
// RootedPath: a file path opened so where it has a root. Immutable;
// thread-safe.
#ifndef STRATA_CORE_PATH_ROOT_H_
#define STRATA_CORE_PATH_ROOT_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dir_fd.h"

namespace strata {

class PathRoot {
 public:
  // The root at `dir` (created when missing), canonicalized; `flag` names
  // the setting in errors. INVALID_ARGUMENT for an empty or relative `dir`,
  // the I/O error when it cannot be created.
  static absl::StatusOr<PathRoot> Open(const std::string& dir, absl::string_view flag);

  // The canonical form of `path`, which must be absolute and resolve inside
  // the root (or be the root itself); INVALID_ARGUMENT naming `field` and the
  // (truncated) path otherwise.
  absl::StatusOr<std::string> Resolve(absl::string_view path, absl::string_view field) const;

  // open(2) of `resolved` (a path Resolve() gave), reached from the root's
  // directory one component at a time without following a symlink: -1 and
  // errno as open(2) leaves it (ELOOP or ENOTDIR where a symlink now stands,
  // EINVAL for a path not under the root).
  int OpenBeneath(const std::string& resolved, int flags, mode_t mode = 0) const;

  // The directory `resolved` (a path Resolve() gave), reached from the
  // root's directory one component at a time without following a symlink,
  // each missing component made (0755) first when `create`.
  // INVALID_ARGUMENT for a path not under the root; FAILED_PRECONDITION
  // naming the component that cannot be opened or made (a symlink there).
  absl::StatusOr<DirFd> OpenDirBeneath(const std::string& resolved, bool create) const;

  const std::string& dir() const { return dir_; }

 private:
  // The components of `resolved` under the root; nullopt when it is not
  // under the root or has a "." or ".." component.
  std::optional<std::vector<std::string>> NamesBeneath(const std::string& resolved) const;
  struct Descriptor;  // the root directory's, closed with the last copy
  PathRoot(std::string dir, std::string flag, std::shared_ptr<const Descriptor> fd)
      : dir_(std::move(dir)), flag_(std::move(flag)), fd_(std::move(fd)) {}
  std::string dir_;
  std::string flag_;
  std::shared_ptr<const Descriptor> fd_;
};

// Whether `name` is one component of a path: not empty, no '/', not "."
// or ".." (a file named inside a directory stays in it).
bool IsPlainFileName(absl::string_view name);

// A file to open: beneath its root (PathRoot::OpenBeneath) where it has one,
// with open(2) otherwise (the daemon's own files: a plain path converts).
class RootedPath {
 public:
  RootedPath() = default;
  RootedPath(std::string path) : path_(std::move(path)) {}  // NOLINT(runtime/explicit)
  RootedPath(std::string path, PathRoot root) : path_(std::move(path)), root_(std::move(root)) {}

  const std::string& path() const { return path_; }
  bool empty() const { return path_.empty(); }
  // -1 and errno as open(2) on failure.
  int Open(int flags, mode_t mode = 0) const;

 private:
  std::string path_;
  std::optional<PathRoot> root_;
};

}  // namespace strata

#endif  // STRATA_CORE_PATH_ROOT_H_
