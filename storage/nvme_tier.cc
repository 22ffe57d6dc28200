#include "storage/nvme_tier.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/round_up.h"
#include "core/status_macros.h"
#include "storage/uring_submit.h"

namespace strata {
namespace {

std::string ErrnoText(int error) {
  return absl::StrCat(std::strerror(error), " (errno ", error, ")");
}

// An I/O error of the ring as a status.
absl::Status IoError(int error, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", ErrnoText(error));
  switch (error) {
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

// One submission: at most max_io_bytes of an op, retried from where a short
// transfer stopped.
struct NvmeTier::Part {
  Op* op;
  uint64_t offset;  // within the op
  uint64_t num_bytes;
  uint64_t done_bytes = 0;
};

struct NvmeTier::Op {
  bool write = false;
  uint64_t extent_id = 0;
  uint64_t extent_offset = 0;  // within the extent
  uint64_t file_offset = 0;
  std::byte* data = nullptr;
  uint64_t num_bytes = 0;
  // Per block: writes, of the data; reads, the extent's when submitted.
  std::vector<uint64_t> checksums;
  IoDone done;
  std::vector<Part> parts;
  std::atomic<size_t> parts_left{0};
  absl::Mutex status_mu;
  absl::Status status ABSL_GUARDED_BY(status_mu);
};

NvmeTier::NvmeTier(std::string path, int fd, uint64_t budget_bytes, unsigned queue_depth,
                   uint64_t max_io_bytes)
    : path_(std::move(path)),
      fd_(fd),
      budget_bytes_(budget_bytes),
      queue_depth_(queue_depth),
      max_io_bytes_(max_io_bytes) {
  // Block 0 is the tier's own: the start-up self-check writes it, so that
  // reopening the file never touches an extent.
  extents_[kProbeExtentId] = ExtentState{0, kBlockBytes, {0}, {false}};
  free_.Give(kBlockBytes, budget_bytes);
}

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeTierOptions& options) {
  uint64_t budget = options.budget_bytes / kBlockBytes * kBlockBytes;
  if (budget == 0) {
    return absl::InvalidArgumentError("NVMe tier: the budget must be at least one 4 KiB block");
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError("NVMe tier: queue depth must be in [1, 4096]");
  }
  if (options.max_io_bytes < kBlockBytes || options.max_io_bytes % kBlockBytes != 0 ||
      options.max_io_bytes > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "NVMe tier: the I/O size must be a multiple of 4 KiB, at most 1 GiB");
  }
  std::error_code error;
  std::filesystem::create_directories(options.dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe tier: cannot create ", options.dir, ": ", error.message()));
  }
  std::string path = absl::StrCat(options.dir, "/strata-nvme.data");
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EINVAL) {
      return absl::FailedPreconditionError(absl::StrCat(
          "NVMe tier: the file system of ", options.dir,
          " refuses O_DIRECT; use a directory on a file system that supports it (ext4, xfs)"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe tier: cannot open ", path, ": ", ErrnoText(e)));
  }
  // The budget, after the tier's own block 0.
  if (fallocate(fd, 0, 0, static_cast<off_t>(budget + kBlockBytes)) != 0) {
    int e = errno;
    close(fd);
    std::string message = absl::StrCat("NVMe tier: cannot preallocate ", budget, " bytes for ",
                                       path, ": ", ErrnoText(e));
    if (e == ENOSPC) return absl::ResourceExhaustedError(message);
    return absl::FailedPreconditionError(message);
  }
  std::unique_ptr<NvmeTier> tier(
      new NvmeTier(path, fd, budget, options.queue_depth, options.max_io_bytes));
  if (absl::Status s = tier->InitRing(); !s.ok()) return s;
  // Self-check: one block written and read back through the ring, so that a
  // refusal shows now and plainly rather than at the first step.
  const Extent probe{kProbeExtentId, 0, kBlockBytes};
  auto* buffer = static_cast<std::byte*>(std::aligned_alloc(kBlockBytes, kBlockBytes));
  std::memset(buffer, 0x5a, kBlockBytes);
  absl::Status result = WriteAndWait(*tier, probe, 0, absl::MakeConstSpan(buffer, kBlockBytes));
  if (result.ok()) result = ReadAndWait(*tier, probe, 0, absl::MakeSpan(buffer, kBlockBytes));
  std::free(buffer);
  if (!result.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NVMe tier: O_DIRECT I/O through io_uring on ", path, " failed: ", result.message()));
  }
  return tier;
}

absl::Status NvmeTier::InitRing() {
  int r = io_uring_queue_init(queue_depth_, &ring_, 0);
  if (r < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NVMe tier: io_uring is not available: ", ErrnoText(-r),
        "; it needs Linux 5.6 or later with io_uring enabled (sysctl kernel.io_uring_disabled=0, "
        "and no seccomp profile that blocks it)"));
  }
  ring_ready_ = true;
  r = io_uring_register_files(&ring_, &fd_, 1);
  if (r < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NVMe tier: io_uring refused to register ", path_, ": ", ErrnoText(-r)));
  }
  completions_ = std::thread([this] { CompletionLoop(); });
  return absl::OkStatus();
}

NvmeTier::~NvmeTier() {
  if (completions_.joinable()) {
    absl::MutexLock lock(&sq_mu_);
    stopping_ = true;
    sq_mu_.Await(absl::Condition(
        +[](unsigned* in_flight) { return *in_flight == 0; }, &in_flight_));
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);  // tells the completion loop to stop
    SubmitQueuedParts();
  }
  if (completions_.joinable()) completions_.join();
  if (ring_ready_) io_uring_queue_exit(&ring_);
  close(fd_);
}

uint64_t NvmeTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

absl::StatusOr<Extent> NvmeTier::Allocate(uint64_t num_bytes) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const uint64_t rounded, RoundUpInBudget("NVMe tier", num_bytes, kBlockBytes,
                                                           used_bytes_, budget_bytes_));
  if (std::optional<uint64_t> offset = free_.TakeBestFit(rounded)) {
    Extent extent{next_id_++, *offset, num_bytes};
    size_t blocks = rounded / kBlockBytes;
    extents_[extent.id] = ExtentState{*offset, num_bytes, std::vector<uint64_t>(blocks),
                                      std::vector<bool>(blocks, false)};
    used_bytes_ += rounded;
    return extent;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("NVMe tier: ", num_bytes, " bytes fit the budget but no free range of ", path_,
                   " holds them: the largest free range is ", free_.largest_range_bytes(), " of ",
                   free_.free_bytes(), " free bytes, cut apart by extents of other sizes"));
}

absl::StatusOr<Extent> NvmeTier::Adopt(uint64_t offset, uint64_t num_bytes,
                                       const std::vector<uint64_t>& checksums) {
  // Sizes beyond the budget are refused before rounding up could wrap.
  const uint64_t rounded = num_bytes > budget_bytes_ ? 0 : RoundUp(num_bytes, kBlockBytes);
  const size_t blocks = rounded / kBlockBytes;
  if (num_bytes == 0 || rounded == 0 || offset % kBlockBytes != 0 ||
      (!checksums.empty() && checksums.size() != blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("NVMe tier: cannot adopt ", num_bytes,
                                                   " bytes at ", offset, " with ", checksums.size(),
                                                   " checksums"));
  }
  absl::MutexLock lock(&mu_);
  if (!free_.TakeAt(offset, rounded)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NVMe tier: bytes [", offset, ", ", offset + rounded, ") of ", path_, " are not free"));
  }
  Extent extent{next_id_++, offset, num_bytes};
  extents_[extent.id] =
      ExtentState{offset, num_bytes, checksums.empty() ? std::vector<uint64_t>(blocks) : checksums,
                  std::vector<bool>(blocks, !checksums.empty())};
  used_bytes_ += rounded;
  return extent;
}

absl::StatusOr<std::vector<uint64_t>> NvmeTier::Checksums(const Extent& extent) const {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(extent.id);
  if (it == extents_.end())
    return absl::NotFoundError(absl::StrCat("NVMe tier: no extent ", extent.id));
  for (bool written : it->second.written) {
    if (!written) {
      return absl::FailedPreconditionError(
          absl::StrCat("NVMe tier: extent ", extent.id, " is not written whole"));
    }
  }
  return it->second.checksums;
}

void NvmeTier::Free(const Extent& extent) {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(extent.id);
  if (it == extents_.end() || extent.id == kProbeExtentId) return;
  uint64_t offset = it->second.offset;
  uint64_t size = RoundUp(it->second.num_bytes, kBlockBytes);
  extents_.erase(it);
  used_bytes_ -= size;
  free_.Give(offset, size);
}

absl::StatusOr<uint64_t> NvmeTier::Check(const Extent& extent, uint64_t offset, const void* buffer,
                                         uint64_t num_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(extent.id);
  if (it == extents_.end()) {
    return absl::NotFoundError(absl::StrCat("NVMe tier: no extent ", extent.id));
  }
  uint64_t size = RoundUp(it->second.num_bytes, kBlockBytes);
  RETURN_IF_ERROR(CheckRange("NVMe tier", extent.id, size, offset, num_bytes));
  if (offset % kBlockBytes != 0 || num_bytes % kBlockBytes != 0 ||
      reinterpret_cast<uintptr_t>(buffer) % kBlockBytes != 0) {
    return absl::InvalidArgumentError(
        "NVMe tier: offsets, sizes and buffers must be 4 KiB aligned (O_DIRECT)");
  }
  return it->second.offset + offset;
}

int NvmeTier::FixedBufferIndex(const void* data, uint64_t num_bytes) const {
  auto* begin = static_cast<const std::byte*>(data);
  for (size_t i = 0; i < fixed_buffers_.size(); ++i) {
    const absl::Span<std::byte>& b = fixed_buffers_[i];
    if (begin >= b.data() && begin + num_bytes <= b.data() + b.size()) return static_cast<int>(i);
  }
  return -1;
}

absl::Status NvmeTier::RegisterBuffers(const std::vector<absl::Span<std::byte>>& buffers) {
  if (!fixed_buffers_.empty()) {
    return absl::FailedPreconditionError("NVMe tier: buffers are registered already");
  }
  std::vector<iovec> iovecs;
  uint64_t total = 0;
  for (const auto& b : buffers) {
    if (reinterpret_cast<uintptr_t>(b.data()) % kBlockBytes != 0) {
      return absl::InvalidArgumentError("NVMe tier: registered buffers must be 4 KiB aligned");
    }
    iovecs.push_back(iovec{b.data(), b.size()});
    total += b.size();
  }
  absl::MutexLock lock(&sq_mu_);
  int r = io_uring_register_buffers(&ring_, iovecs.data(), static_cast<unsigned>(iovecs.size()));
  if (r < 0) {
    std::string message =
        absl::StrCat("NVMe tier: registering ", total, " bytes of buffers: ", ErrnoText(-r));
    if (-r == ENOMEM || -r == EPERM) {
      return absl::ResourceExhaustedError(
          absl::StrCat(message,
                       "; registered buffers are page-locked: raise the memlock limit (ulimit -l) "
                       "or grant CAP_IPC_LOCK"));
    }
    return absl::FailedPreconditionError(message);
  }
  fixed_buffers_ = buffers;
  return absl::OkStatus();
}

void NvmeTier::Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) {
  absl::StatusOr<uint64_t> file_offset = Check(from, offset, to.data(), to.size());
  if (!file_offset.ok()) {
    std::move(done)(file_offset.status());
    return;
  }
  auto op = std::make_unique<Op>();
  {
    absl::MutexLock lock(&mu_);
    const ExtentState& state = extents_.at(from.id);
    for (uint64_t b = offset / kBlockBytes; b < (offset + to.size()) / kBlockBytes; ++b) {
      if (!state.written[b]) {
        std::move(done)(absl::FailedPreconditionError(
            absl::StrCat("NVMe tier: block ", b, " of extent ", from.id, " was never written")));
        return;
      }
      op->checksums.push_back(state.checksums[b]);
    }
  }
  op->extent_id = from.id;
  op->extent_offset = offset;
  op->file_offset = *file_offset;
  op->data = to.data();
  op->num_bytes = to.size();
  op->done = std::move(done);
  Submit(std::move(op));
}

void NvmeTier::Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
                     IoDone done) {
  absl::StatusOr<uint64_t> file_offset = Check(to, offset, from.data(), from.size());
  if (!file_offset.ok()) {
    std::move(done)(file_offset.status());
    return;
  }
  auto op = std::make_unique<Op>();
  op->write = true;
  op->extent_id = to.id;
  op->extent_offset = offset;
  op->file_offset = *file_offset;
  op->data = const_cast<std::byte*>(from.data());  // only read: the ring's API is not const
  op->num_bytes = from.size();
  for (uint64_t b = 0; b < from.size(); b += kBlockBytes) {
    op->checksums.push_back(XXH3_64bits(from.data() + b, kBlockBytes));
  }
  op->done = std::move(done);
  Submit(std::move(op));
}

void NvmeTier::Submit(std::unique_ptr<Op> op) {
  for (uint64_t offset = 0; offset < op->num_bytes; offset += max_io_bytes_) {
    op->parts.push_back(
        Part{op.get(), offset, std::min<uint64_t>(max_io_bytes_, op->num_bytes - offset)});
  }
  if (op->parts.empty()) {
    std::move(op->done)(absl::OkStatus());
    return;
  }
  op->parts_left = op->parts.size();
  // From here the op belongs to its parts: the last one to finish deletes it,
  // so the loop reads only locals once a part may have been submitted.
  Part* parts = op->parts.data();
  const size_t num_parts = op->parts.size();
  op.release();
  for (size_t i = 0; i < num_parts; ++i) {
    Part& part = parts[i];
    bool submitted = false;
    {
      absl::MutexLock lock(&sq_mu_);
      sq_mu_.Await(absl::Condition(
          +[](NvmeTier* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->sq_mu_) {
            return t->stopping_ || t->in_flight_ < t->queue_depth_;
          },
          this));
      if (!stopping_) {
        ++in_flight_;
        Prepare(&part);
        submitted = true;
      }
    }
    // A part not submitted completes at once, with the shutdown error.
    if (!submitted) FinishPart(&part, absl::UnavailableError("NVMe tier: shutting down"));
  }
}

void NvmeTier::Prepare(Part* part) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // in_flight_ <= depth: never null
  Op* op = part->op;
  std::byte* data = op->data + part->offset + part->done_bytes;
  unsigned length = static_cast<unsigned>(part->num_bytes - part->done_bytes);
  uint64_t offset = op->file_offset + part->offset + part->done_bytes;
  int fixed = FixedBufferIndex(data, length);
  if (op->write) {
    if (fixed >= 0) {
      io_uring_prep_write_fixed(sqe, 0, data, length, offset, fixed);
    } else {
      io_uring_prep_write(sqe, 0, data, length, offset);
    }
    sqe->rw_flags = RWF_DSYNC;
  } else if (fixed >= 0) {
    io_uring_prep_read_fixed(sqe, 0, data, length, offset, fixed);
  } else {
    io_uring_prep_read(sqe, 0, data, length, offset);
  }
  io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
  io_uring_sqe_set_data(sqe, part);
  SubmitQueuedParts();
}

void NvmeTier::SubmitQueuedParts() {
  // Left queued on an error, a request goes with the next submission.
  if (int r = SubmitQueued(&ring_); r < 0) {
    LogEventCat("nvme", "io_uring submission to ", path_, " failed: ", ErrnoText(-r),
                "; trying again with the next request");
  }
}

void NvmeTier::FinishPart(Part* part, absl::Status status) {
  Op* op = part->op;
  if (!status.ok()) {
    absl::MutexLock lock(&op->status_mu);
    op->status.Update(status);
  }
  if (--op->parts_left > 0) return;
  absl::Status op_status;
  {
    absl::MutexLock lock(&op->status_mu);
    op_status = op->status;
  }
  Complete(std::unique_ptr<Op>(op), op_status);
}

void NvmeTier::CompletionLoop() {
  while (true) {
    io_uring_cqe* cqe = nullptr;
    int r = io_uring_wait_cqe(&ring_, &cqe);
    if (r < 0) continue;  // EINTR
    auto* part = static_cast<Part*>(io_uring_cqe_get_data(cqe));
    int result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (part == nullptr) return;  // the destructor's stop
    Op* op = part->op;
    absl::Status status;
    if (result < 0) {
      status = IoError(-result, absl::StrCat("NVMe tier: ", op->write ? "write" : "read", " of ",
                                             part->num_bytes, " bytes at ",
                                             op->file_offset + part->offset, " in ", path_));
    } else if (result == 0) {
      status = absl::DataLossError(
          absl::StrCat("NVMe tier: ", path_, " ended early at ", op->file_offset + part->offset));
    } else {
      part->done_bytes += static_cast<uint64_t>(result);
      if (part->done_bytes < part->num_bytes) {  // short: queue the rest
        absl::MutexLock lock(&sq_mu_);
        Prepare(part);
        continue;
      }
    }
    {
      absl::MutexLock lock(&sq_mu_);
      --in_flight_;
    }
    if (status.ok() && !op->write) status = VerifyPart(*part);
    FinishPart(part, status);
  }
}

absl::Status NvmeTier::VerifyPart(const Part& part) const {
  const Op& op = *part.op;
  for (uint64_t at = part.offset; at < part.offset + part.num_bytes; at += kBlockBytes) {
    if (XXH3_64bits(op.data + at, kBlockBytes) != op.checksums[at / kBlockBytes]) {
      return absl::DataLossError(absl::StrCat(
          "NVMe tier: checksum mismatch in ", path_, " at byte ", op.file_offset + at, " (extent ",
          op.extent_id, ", block ", (op.extent_offset + at) / kBlockBytes, ")"));
    }
  }
  return absl::OkStatus();
}

void NvmeTier::Complete(std::unique_ptr<Op> op, absl::Status status) {
  uint64_t first_block = op->extent_offset / kBlockBytes;
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    auto it = extents_.find(op->extent_id);
    if (it == extents_.end()) {
      status = absl::NotFoundError(
          absl::StrCat("NVMe tier: extent ", op->extent_id, " was freed during I/O"));
    } else if (op->write) {
      for (size_t i = 0; i < op->checksums.size(); ++i) {
        it->second.checksums[first_block + i] = op->checksums[i];
        it->second.written[first_block + i] = true;
      }
    }
  }
  if (status.ok()) (op->write ? written_bytes_ : read_bytes_) += op->num_bytes;
  std::move(op->done)(status);
}

}  // namespace strata
