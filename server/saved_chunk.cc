#include "server/saved_chunk.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace strata {
namespace {

// XXH3 of p, m and v in that order: the file's contents.
uint64_t Checksum(const StateView& state, size_t bytes) {
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  for (const float* part : {state.p, state.m, state.v}) XXH3_64bits_update(hash, part, bytes);
  uint64_t checksum = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  return checksum;
}

}  // namespace

absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const StateView& state,
                                        uint64_t num_params) {
  const size_t bytes = num_params * sizeof(float);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", path);
  absl::Status status;
  for (const float* part : {state.p, state.m, state.v}) {
    if (status.ok()) status = WriteFully(fd, part, bytes, path);
  }
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  if (!status.ok()) return status;
  return Checksum(state, bytes);
}

absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            const StateView& state) {
  const size_t bytes = num_params * sizeof(float);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::DataLossError(absl::StrCat("chunk file ", path, " is missing"));
    return ErrnoError("cannot open", path);
  }
  absl::Status status;
  for (float* part : {state.p, state.m, state.v}) {
    if (status.ok()) status = ReadFully(fd, part, bytes, path);
  }
  char extra;
  if (status.ok() && read(fd, &extra, 1) != 0) {
    status = absl::DataLossError(absl::StrCat("chunk file ", path, " is longer than recorded"));
  }
  close(fd);
  if (!status.ok()) return status;
  if (Checksum(state, bytes) != checksum) {
    return absl::DataLossError(absl::StrCat("chunk file ", path, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

}  // namespace strata
