#include "server/saved_chunk.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const StateView& state,
                                        uint64_t num_params) {
  const size_t bytes = num_params * sizeof(float);
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    XXH3_freeState(hash);
    return IoError("cannot create", path);
  }
  absl::Status status;
  for (const float* part : {state.p, state.m, state.v}) {
    XXH3_64bits_update(hash, part, bytes);
    const char* data = reinterpret_cast<const char*>(part);
    for (size_t done = 0; done < bytes && status.ok();) {
      ssize_t n = write(fd, data + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) status = IoError("cannot write", path);
      if (n > 0) done += n;
    }
  }
  if (status.ok() && fsync(fd) != 0) status = IoError("cannot sync", path);
  close(fd);
  uint64_t checksum = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  if (!status.ok()) return status;
  return checksum;
}

absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            const StateView& state) {
  const size_t bytes = num_params * sizeof(float);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat("saved chunk ", path, " is missing"));
    return IoError("cannot open", path);
  }
  absl::Status status;
  for (float* part : {state.p, state.m, state.v}) {
    char* data = reinterpret_cast<char*>(part);
    for (size_t done = 0; done < bytes && status.ok();) {
      ssize_t n = read(fd, data + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status = IoError("cannot read", path);
      if (n == 0) {
        status = absl::DataLossError(absl::StrCat("saved chunk ", path, " is truncated"));
      }
      if (n > 0) done += n;
    }
  }
  char extra;
  if (status.ok() && read(fd, &extra, 1) != 0) {
    status = absl::DataLossError(absl::StrCat("saved chunk ", path, " is longer than recorded"));
  }
  close(fd);
  if (!status.ok()) return status;
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  for (const float* part : {state.p, state.m, state.v}) XXH3_64bits_update(hash, part, bytes);
  uint64_t got = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  if (got != checksum) {
    return absl::DataLossError(absl::StrCat("saved chunk ", path, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

}  // namespace strata
