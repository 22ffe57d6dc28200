#include "server/saved_chunk.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status_macros.h"

namespace strata {
namespace {

constexpr size_t kDirectBlockBytes = 4096;
constexpr size_t kPieceBytes = size_t{8} << 20;
constexpr unsigned kPiecesInFlight = 4;

// Writes `bytes` of `data` at `file_offset` of `fd` (or reads them into `data`:
// `read`) in kPieceBytes pieces, kPiecesInFlight at a time (io_uring), and
// adds them to `hash` in order while the other pieces are in flight. A read
// that ends early is DATA_LOSS naming the file.
absl::Status TransferInFlight(bool read, int fd, char* data, size_t bytes, const std::string& path,
                              XXH3_state_t* hash, uint64_t file_offset = 0) {
  if (bytes == 0) return absl::OkStatus();
  io_uring ring;
  if (int r = io_uring_queue_init(kPiecesInFlight, &ring, 0); r < 0) {
    errno = -r;
    return ErrnoError("cannot set up io_uring for", path);
  }
  const char* verb = read ? "read" : "write";
  absl::Status status;
  size_t submitted = 0;
  size_t done = 0;  // transferred, from offset 0 on
  size_t hashed = 0;
  unsigned in_flight = 0;
  std::vector<bool> piece_done((bytes + kPieceBytes - 1) / kPieceBytes, false);
  while (status.ok() && (submitted < bytes || in_flight > 0)) {
    while (submitted < bytes && in_flight < kPiecesInFlight) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const unsigned n = static_cast<unsigned>(std::min(kPieceBytes, bytes - submitted));
      if (read) {
        io_uring_prep_read(sqe, fd, data + submitted, n, file_offset + submitted);
      } else {
        io_uring_prep_write(sqe, fd, data + submitted, n, file_offset + submitted);
      }
      io_uring_sqe_set_data64(sqe, submitted);
      submitted += n;
      ++in_flight;
    }
    io_uring_submit(&ring);
    // What is in memory in order: all of it when writing, what arrived when reading.
    const size_t hashable = read ? done : submitted;
    if (hashed < hashable) {
      const size_t n = std::min(kPieceBytes, hashable - hashed);
      XXH3_64bits_update(hash, data + hashed, n);
      hashed += n;
    }
    io_uring_cqe* cqe;
    int r = io_uring_wait_cqe(&ring, &cqe);
    if (r < 0) {
      errno = -r;
      status = ErrnoError(absl::StrCat("cannot wait for a ", verb, " of"), path);
      break;
    }
    const uint64_t offset = io_uring_cqe_get_data64(cqe);
    const size_t n = std::min(kPieceBytes, bytes - offset);
    if (cqe->res < 0) {
      errno = -cqe->res;
      status = ErrnoError(absl::StrCat("cannot ", verb), path);
    } else if (static_cast<size_t>(cqe->res) < n) {
      // A short transfer: the rest of the piece at once.
      char* rest = data + offset + cqe->res;
      const size_t left = n - cqe->res;
      const off_t at = static_cast<off_t>(file_offset + offset + cqe->res);
      ssize_t r = read ? pread(fd, rest, left, at) : pwrite(fd, rest, left, at);
      if (r < 0) {
        status = ErrnoError(absl::StrCat("cannot ", verb), path);
      } else if (static_cast<size_t>(r) < left) {
        status = read ? absl::DataLossError(absl::StrCat("chunk file ", path, " is truncated"))
                      : ErrnoError("cannot write", path);
      }
    }
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
    piece_done[offset / kPieceBytes] = true;
    while (done < bytes && piece_done[done / kPieceBytes])
      done += std::min(kPieceBytes, bytes - done);
  }
  // After an error, the transfers still in flight end before the buffer may go.
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

// Opens `path` with `flags`, and O_DIRECT too when `buffer` is 4 KiB-aligned
// and the file system takes it; sets `direct` to whether it did. -1 and
// errno as open() leaves them on failure.
int OpenPreferringDirect(const std::string& path, int flags, const void* buffer, bool* direct) {
  int fd = -1;
  if (reinterpret_cast<uintptr_t>(buffer) % kDirectBlockBytes == 0) {
    fd = open(path.c_str(), flags | O_DIRECT, 0600);
  }
  *direct = fd >= 0;
  if (fd < 0) fd = open(path.c_str(), flags, 0600);
  return fd;
}

// TransferInFlight() of `bytes` at offset 0 of `fd`: with `direct` (fd
// opened O_DIRECT), the whole 4 KiB blocks so, then the tail with direct
// I/O off; all of it so otherwise.
absl::Status TransferWhole(bool read, int fd, bool direct, char* data, size_t bytes,
                           const std::string& path, XXH3_state_t* hash) {
  const size_t aligned = direct ? bytes / kDirectBlockBytes * kDirectBlockBytes : 0;
  RETURN_IF_ERROR(TransferInFlight(read, fd, data, aligned, path, hash));
  if (aligned == bytes) return absl::OkStatus();
  if (direct && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
    return ErrnoError("cannot clear O_DIRECT on", path);
  }
  return TransferInFlight(read, fd, data + aligned, bytes - aligned, path, hash, aligned);
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
  bool direct;
  int fd = OpenPreferringDirect(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, state, &direct);
  if (fd < 0) return ErrnoError("cannot create", path);
  Hash hash = NewHash();
  absl::Status status =
      TransferWhole(/*read=*/false, fd, direct, const_cast<char*>(data), bytes, path, hash.get());
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  if (!status.ok()) return status;
  return XXH3_64bits_digest(hash.get());
}

absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            float* state) {
  const size_t bytes = 3 * num_params * sizeof(float);
  char* data = reinterpret_cast<char*>(state);
  bool direct;
  int fd = OpenPreferringDirect(path, O_RDONLY | O_CLOEXEC, state, &direct);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::DataLossError(absl::StrCat("chunk file ", path, " is missing"));
    }
    return ErrnoError("cannot open", path);
  }
  absl::Status status;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    status = ErrnoError("cannot stat", path);
  } else if (static_cast<uint64_t>(st.st_size) < bytes) {
    status = absl::DataLossError(
        absl::StrCat("chunk file ", path, " is truncated: ", st.st_size, " of ", bytes, " bytes"));
  } else if (static_cast<uint64_t>(st.st_size) > bytes) {
    status = absl::DataLossError(absl::StrCat("chunk file ", path, " is longer than recorded"));
  }
  Hash hash = NewHash();
  if (status.ok()) status = TransferWhole(/*read=*/true, fd, direct, data, bytes, path, hash.get());
  close(fd);
  if (!status.ok()) return status;
  if (XXH3_64bits_digest(hash.get()) != checksum) {
    return absl::DataLossError(absl::StrCat("chunk file ", path, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

}  // namespace strata
