// PathRoot: a directory a daemon was configured with, inside which every
// directory or file named by a request must lie. Resolve() canonicalizes a
// requested path (`..`, `.`, repeated slashes, and symlinks of the part that
// exists) and refuses what lands outside the root. A symlink created inside
// the root after the check can still point out of it: roots are meant to be
// directories that only the daemons and their operators write. Immutable;
// thread-safe.
#ifndef STRATA_CORE_PATH_ROOT_H_
#define STRATA_CORE_PATH_ROOT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

  const std::string& dir() const { return dir_; }

 private:
  PathRoot(std::string dir, std::string flag) : dir_(std::move(dir)), flag_(std::move(flag)) {}
  std::string dir_;
  std::string flag_;
};

}  // namespace strata

#endif  // STRATA_CORE_PATH_ROOT_H_
