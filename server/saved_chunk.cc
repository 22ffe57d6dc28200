#include "server/saved_chunk.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"

namespace strata {
namespace {

constexpr size_t kDirectBlockBytes = 4096;
constexpr size_t kPieceBytes = size_t{8} << 20;
constexpr unsigned kPiecesInFlight = 4;

// Writes `bytes` of `data` at offset 0 of `fd` in kPieceBytes pieces,
// kPiecesInFlight at a time (io_uring), and adds them to `hash` in order while
// the writes are in flight.
absl::Status WriteInFlight(int fd, const char* data, size_t bytes, const std::string& path,
                           XXH3_state_t* hash) {
  if (bytes == 0) return absl::OkStatus();
  io_uring ring;
  if (int r = io_uring_queue_init(kPiecesInFlight, &ring, 0); r < 0) {
    errno = -r;
    return ErrnoError("cannot set up io_uring to write", path);
  }
  absl::Status status;
  size_t submitted = 0;
  size_t hashed = 0;
  unsigned in_flight = 0;
  while (status.ok() && (submitted < bytes || in_flight > 0)) {
    while (submitted < bytes && in_flight < kPiecesInFlight) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const unsigned n = static_cast<unsigned>(std::min(kPieceBytes, bytes - submitted));
      io_uring_prep_write(sqe, fd, data + submitted, n, submitted);
      io_uring_sqe_set_data64(sqe, submitted);
      submitted += n;
      ++in_flight;
    }
    io_uring_submit(&ring);
    if (hashed < submitted) {
      const size_t n = std::min(kPieceBytes, submitted - hashed);
      XXH3_64bits_update(hash, data + hashed, n);
      hashed += n;
    }
    io_uring_cqe* cqe;
    int r = io_uring_wait_cqe(&ring, &cqe);
    if (r < 0) {
      errno = -r;
      status = ErrnoError("cannot wait for a write to", path);
      break;
    }
    const uint64_t offset = io_uring_cqe_get_data64(cqe);
    const size_t n = std::min(kPieceBytes, bytes - offset);
    if (cqe->res < 0) {
      errno = -cqe->res;
      status = ErrnoError("cannot write", path);
    } else if (static_cast<size_t>(cqe->res) < n) {
      // A short write: the rest of the piece at once.
      ssize_t rest = pwrite(fd, data + offset + cqe->res, n - cqe->res, offset + cqe->res);
      if (rest != static_cast<ssize_t>(n - cqe->res)) status = ErrnoError("cannot write", path);
    }
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  // After an error, the writes still in flight end before the buffer may go.
  while (in_flight > 0) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  io_uring_queue_exit(&ring);
  if (status.ok() && hashed < bytes) XXH3_64bits_update(hash, data + hashed, bytes - hashed);
  return status;
}

using Hash = std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>;

// A streaming XXH3 (64 bits), reset: the same value as XXH3_64bits() of
// everything added.
Hash NewHash() {
  Hash hash(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(hash.get());
  return hash;
}

// XXH3 of p, m and v in that order: the file's contents.
uint64_t Checksum(const StateView& state, size_t bytes) {
  Hash hash = NewHash();
  for (const float* part : {state.p, state.m, state.v}) XXH3_64bits_update(hash.get(), part, bytes);
  return XXH3_64bits_digest(hash.get());
}

}  // namespace

StateBuffer AllocateStateBuffer(uint64_t num_params) {
  size_t bytes = 3 * num_params * sizeof(float);
  bytes = std::max(kDirectBlockBytes,
                   (bytes + kDirectBlockBytes - 1) / kDirectBlockBytes * kDirectBlockBytes);
  void* buffer = std::aligned_alloc(kDirectBlockBytes, bytes);
  // Faulted in now, before the buffer is filled under a chunk's lock (a 48 MB
  // copy into a fresh buffer spends most of its time in page faults: 25 ms
  // here, against 13 ms to fault it in at once). MADV_POPULATE_WRITE is
  // Linux 5.14's; older kernels refuse it, and then each page is touched.
  if (buffer != nullptr && madvise(buffer, bytes, MADV_POPULATE_WRITE) != 0) {
    for (size_t i = 0; i < bytes; i += kDirectBlockBytes)
      static_cast<volatile char*>(buffer)[i] = 0;
  }
  return StateBuffer(static_cast<float*>(buffer));
}

void CopyState(const StateView& view, uint64_t num_params, float* state) {
  const size_t bytes = num_params * sizeof(float);
  std::memcpy(state, view.p, bytes);
  std::memcpy(state + num_params, view.m, bytes);
  std::memcpy(state + 2 * num_params, view.v, bytes);
}

absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const float* state,
                                        uint64_t num_params) {
  const size_t bytes = 3 * num_params * sizeof(float);
  const char* data = reinterpret_cast<const char*>(state);
  int fd = -1;
  if (reinterpret_cast<uintptr_t>(state) % kDirectBlockBytes == 0) {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600);
  }
  const bool direct = fd >= 0;
  if (fd < 0) fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", path);
  // Whole blocks (direct) in pieces kept in flight; the tail with direct I/O off.
  const size_t aligned = direct ? bytes / kDirectBlockBytes * kDirectBlockBytes : 0;
  Hash hash = NewHash();
  absl::Status status = WriteInFlight(fd, data, aligned, path, hash.get());
  if (status.ok() && aligned < bytes) {
    if (direct && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
      status = ErrnoError("cannot clear O_DIRECT on", path);
    } else if (lseek(fd, static_cast<off_t>(aligned), SEEK_SET) < 0) {
      status = ErrnoError("cannot seek in", path);
    } else {
      status = WriteFully(fd, data + aligned, bytes - aligned, path);
      XXH3_64bits_update(hash.get(), data + aligned, bytes - aligned);
    }
  }
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  if (!status.ok()) return status;
  return XXH3_64bits_digest(hash.get());
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
