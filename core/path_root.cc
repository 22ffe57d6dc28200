#include "core/path_root.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/quoted.h"

namespace strata {

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
  return PathRoot(canonical.string(), std::string(flag));
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
