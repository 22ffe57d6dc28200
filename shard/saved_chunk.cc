#include "shard/saved_chunk.h"

#include <fcntl.h>
#include <liburing.h>
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
#include "core/file_io.h"
#include "core/round_up.h"
#include "core/status_macros.h"
#include "storage/uring_submit.h"

namespace strata {
namespace {

constexpr size_t kDirectBlockBytes = 4096;
constexpr unsigned kPiecesInFlight = 4;

// One piece of a transfer: `n` bytes at `data`, at `offset` of the file.
struct Transfer {
  size_t offset;
  std::byte* data;
  size_t n;
};

// Bytes [from, to) of the state at `data`, cut at piece boundaries.
std::vector<Transfer> CutIntoPieces(std::byte* data, size_t from, size_t to) {
  std::vector<Transfer> transfers;
  for (size_t at = from; at < to;) {
    const size_t n = std::min(to, (at / kSavedChunkPieceBytes + 1) * kSavedChunkPieceBytes) - at;
    transfers.push_back({at, data + at, n});
    at += n;
  }
  return transfers;
}

// The rest of `t` after io_uring moved its first `moved` bytes, at once.
absl::Status FinishShortTransfer(bool read, int fd, const Transfer& t, size_t moved,
                                 const std::string& path) {
  std::byte* rest = t.data + moved;
  const size_t left = t.n - moved;
  const off_t at = static_cast<off_t>(t.offset + moved);
  ssize_t r = read ? pread(fd, rest, left, at) : pwrite(fd, rest, left, at);
  if (r < 0) return ErrnoError(absl::StrCat("cannot ", read ? "read" : "write"), path);
  if (static_cast<size_t>(r) < left) {
    return read ? absl::DataLossError(absl::StrCat("chunk file ", path, " is truncated"))
                : ErrnoError("cannot write", path);
  }
  return absl::OkStatus();
}

// Writes bytes [from, to) of the state at `data` at the same offsets of
// `fd` (or reads them into it: `read`), in pieces of kSavedChunkPieceBytes with
// kPiecesInFlight in flight (io_uring), and adds them to `hash` in order
// while the others are in flight. A read that ends early is DATA_LOSS naming
// the file.
absl::Status TransferInFlight(bool read, int fd, std::byte* data, size_t from, size_t to,
                              const std::string& path, XXH3_state_t* hash) {
  if (from == to) return absl::OkStatus();
  const std::vector<Transfer> transfers = CutIntoPieces(data, from, to);
  io_uring ring;
  if (int r = io_uring_queue_init(kPiecesInFlight, &ring, 0); r < 0) {
    errno = -r;
    return ErrnoError("cannot set up io_uring for", path);
  }
  const char* verb = read ? "read" : "write";
  absl::Status status;
  size_t submitted = 0;  // transfers
  size_t done = 0;       // transfers complete, from the first on
  size_t hashed = 0;
  unsigned in_flight = 0;
  std::vector<bool> transfer_done(transfers.size(), false);
  while (status.ok() && (submitted < transfers.size() || in_flight > 0)) {
    while (submitted < transfers.size() && in_flight < kPiecesInFlight) {
      const Transfer& t = transfers[submitted];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (read) {
        io_uring_prep_read(sqe, fd, t.data, static_cast<unsigned>(t.n), t.offset);
      } else {
        io_uring_prep_write(sqe, fd, t.data, static_cast<unsigned>(t.n), t.offset);
      }
      io_uring_sqe_set_data64(sqe, submitted);
      ++submitted;
      ++in_flight;
    }
    if (int r = SubmitQueued(&ring); r < 0) {
      in_flight -= io_uring_sq_ready(&ring);  // never handed over: will not complete
      errno = -r;
      status = ErrnoError(absl::StrCat("cannot submit a ", verb, " of"), path);
      break;
    }
    // What is in memory in order: all of it when writing, what arrived when reading.
    if (hashed < (read ? done : submitted)) {
      XXH3_64bits_update(hash, transfers[hashed].data, transfers[hashed].n);
      ++hashed;
    }
    io_uring_cqe* cqe;
    int r = io_uring_wait_cqe(&ring, &cqe);
    if (r < 0) {
      errno = -r;
      status = ErrnoError(absl::StrCat("cannot wait for a ", verb, " of"), path);
      break;
    }
    const size_t index = io_uring_cqe_get_data64(cqe);
    if (cqe->res < 0) {
      errno = -cqe->res;
      status = ErrnoError(absl::StrCat("cannot ", verb), path);
    } else if (static_cast<size_t>(cqe->res) < transfers[index].n) {
      status = FinishShortTransfer(read, fd, transfers[index], cqe->res, path);
    }
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
    transfer_done[index] = true;
    while (done < transfers.size() && transfer_done[done]) ++done;
  }
  // After an error, the transfers still in flight end before the memory may go.
  while (in_flight > 0) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
  }
  io_uring_queue_exit(&ring);
  for (; status.ok() && hashed < transfers.size(); ++hashed) {
    XXH3_64bits_update(hash, transfers[hashed].data, transfers[hashed].n);
  }
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

// Opens `file` with `flags`, and O_DIRECT too when `data` is 4 KiB-aligned
// and the file system takes it; sets `direct` to whether it did. -1 and
// errno as open() leaves them on failure.
int OpenPreferringDirect(const RootedPath& file, int flags, const void* data, bool* direct) {
  int fd = -1;
  if (reinterpret_cast<uintptr_t>(data) % kDirectBlockBytes == 0) {
    fd = file.Open(flags | O_DIRECT, 0600);
  }
  *direct = fd >= 0;
  if (fd < 0) fd = file.Open(flags, 0600);
  return fd;
}

// TransferInFlight() of `bytes` at offset 0 of `fd`: with `direct` (fd
// opened O_DIRECT), the whole 4 KiB blocks so, then the tail with direct
// I/O off; all of it so otherwise.
absl::Status TransferWhole(bool read, int fd, bool direct, std::byte* data, size_t bytes,
                           const std::string& path, XXH3_state_t* hash) {
  const size_t aligned = direct ? bytes / kDirectBlockBytes * kDirectBlockBytes : 0;
  RETURN_IF_ERROR(TransferInFlight(read, fd, data, 0, aligned, path, hash));
  if (aligned == bytes) return absl::OkStatus();
  if (direct && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) {
    return ErrnoError("cannot clear O_DIRECT on", path);
  }
  return TransferInFlight(read, fd, data, aligned, bytes, path, hash);
}

}  // namespace

StateBuffer AllocateStateBuffer(uint64_t bytes) {
  bytes = std::max<uint64_t>(kDirectBlockBytes, RoundUp(bytes, kDirectBlockBytes));
  return StateBuffer(AllocateFaultedIn(bytes));
}

absl::StatusOr<ArenaState> ArenaState::Take(StateArena* arena, StateShape shape) {
  ASSIGN_OR_RETURN(std::byte * data, arena->Take(shape.bytes()));
  ArenaState state;
  state.arena_ = arena;
  state.data_ = data;
  state.shape_ = shape;
  return state;
}

ArenaState& ArenaState::operator=(ArenaState&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    shape_ = std::exchange(other.shape_, StateShape());
  }
  return *this;
}

void ArenaState::Reset() {
  if (arena_ != nullptr) {
    arena_->Give(data_, shape_.bytes());
  }
  arena_ = nullptr;
  data_ = nullptr;
  shape_ = StateShape();
}

// A view's arrays lie in one buffer from p on (state_view.h).
void ArenaState::CopyFrom(const StateView& view) {
  std::memcpy(data_, view.bytes(), shape_.bytes());
}

absl::StatusOr<uint64_t> SaveChunkState(const RootedPath& file, const std::byte* state,
                                        uint64_t bytes) {
  const std::string& path = file.path();
  std::byte* data = const_cast<std::byte*>(state);
  bool direct;
  int fd = OpenPreferringDirect(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, data, &direct);
  if (fd < 0) return ErrnoError("cannot create", path);
  Hash hash = NewHash();
  absl::Status status = TransferWhole(/*read=*/false, fd, direct, data, bytes, path, hash.get());
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  if (!status.ok()) return status;
  return XXH3_64bits_digest(hash.get());
}

uint64_t ChecksumChunkState(const std::byte* state, uint64_t bytes) {
  return XXH3_64bits(state, bytes);
}

absl::StatusOr<uint64_t> SaveOrChecksumChunkState(const RootedPath& file, const std::byte* state,
                                                  uint64_t bytes) {
  if (file.empty()) return ChecksumChunkState(state, bytes);
  return SaveChunkState(file, state, bytes);
}

absl::Status LoadChunkState(const RootedPath& file, uint64_t checksum, uint64_t bytes,
                            std::byte* state) {
  const std::string& path = file.path();
  std::byte* data = state;
  bool direct;
  int fd = OpenPreferringDirect(file, O_RDONLY | O_CLOEXEC, data, &direct);
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
  if (status.ok()) {
    status = TransferWhole(/*read=*/true, fd, direct, data, bytes, path, hash.get());
  }
  close(fd);
  if (!status.ok()) return status;
  if (XXH3_64bits_digest(hash.get()) != checksum) {
    return absl::DataLossError(absl::StrCat("chunk file ", path, ": checksum mismatch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SaveBytes(const std::string& path, absl::string_view bytes) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open", path);
  absl::Status s = WriteFully(fd, bytes.data(), bytes.size(), path);
  if (s.ok() && fsync(fd) != 0) s = ErrnoError("fsync", path);
  close(fd);
  RETURN_IF_ERROR(s);
  return XXH3_64bits(bytes.data(), bytes.size());
}

absl::StatusOr<std::string> LoadBytes(const std::string& path, uint64_t checksum, size_t size) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::DataLossError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  std::string bytes(size, '\0');
  absl::Status s;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    s = absl::DataLossError(absl::StrCat(path, " holds ", st.st_size, " bytes, not ", size));
  } else {
    s = ReadFully(fd, bytes.data(), size, path);
  }
  close(fd);
  RETURN_IF_ERROR(s);
  if (XXH3_64bits(bytes.data(), bytes.size()) != checksum) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch"));
  }
  return bytes;
}

}  // namespace strata
