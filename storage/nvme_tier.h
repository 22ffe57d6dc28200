// NvmeTier: chunk extents in one preallocated file opened with O_DIRECT
// (block 0 is the tier's own; extents follow, and survive a reopen through
// Adopt()),
// driven by io_uring (the file registered, and caller buffers registered with
// RegisterBuffers() used through fixed reads and writes). Extents are 4 KiB
// aligned; every 4 KiB block carries an XXH3 checksum, set when the block is
// written and verified on every read (DATA_LOSS naming the file, extent and
// offset on a mismatch). Writes are durable when they complete (RWF_DSYNC).
//
// Thread-safe. One I/O thread owns the ring's completions and runs `done`.
// A read or write goes to the ring in pieces of at most max_io_bytes; at most
// `queue_depth` pieces are in flight, further submissions wait.
// The destructor waits for every operation in flight.
#ifndef STRATA_STORAGE_NVME_TIER_H_
#define STRATA_STORAGE_NVME_TIER_H_

#include <liburing.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "storage/free_ranges.h"
#include "storage/tier.h"

namespace strata {

struct NvmeTierOptions {
  std::string dir;  // the file is dir/strata-nvme.data
  uint64_t budget_bytes = 0;
  unsigned queue_depth = 32;
  // Reads and writes are submitted in pieces of at most this many bytes.
  uint64_t max_io_bytes = uint64_t{1} << 20;
};

class NvmeTier : public Tier {
 public:
  static constexpr uint64_t kBlockBytes = 4096;

  // Creates and preallocates the file and checks that O_DIRECT I/O through
  // io_uring works on it. FAILED_PRECONDITION saying what was refused and why
  // (io_uring not available, O_DIRECT not supported by the file system);
  // RESOURCE_EXHAUSTED when the file cannot be preallocated.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Open(const NvmeTierOptions& options);
  ~NvmeTier() override;

  TierKind kind() const override { return TierKind::kNvme; }
  uint64_t budget_bytes() const override { return budget_bytes_; }
  uint64_t used_bytes() const override;
  // Bytes read and written by completed I/O since Open (for metrics).
  uint64_t read_bytes() const { return read_bytes_.load(std::memory_order_relaxed); }
  uint64_t written_bytes() const { return written_bytes_.load(std::memory_order_relaxed); }
  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override;
  void Free(const Extent& extent) override;
  // Reading a block never written since Allocate is FAILED_PRECONDITION.
  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override;
  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override;
  std::byte* Map(const Extent&) override { return nullptr; }

  // Takes back, after a restart, an extent a previous run allocated at
  // `offset`, with the checksums of its blocks (empty: none written yet).
  // FAILED_PRECONDITION when the bytes are not free.
  absl::StatusOr<Extent> Adopt(uint64_t offset, uint64_t num_bytes,
                               const std::vector<uint64_t>& checksums);
  // The checksums of an extent whose every block is written, to be recorded
  // with it for Adopt().
  absl::StatusOr<std::vector<uint64_t>> Checksums(const Extent& extent) const override;

  // Registers buffers for fixed I/O: later reads and writes that lie inside
  // one of them skip the kernel's per-I/O page pinning. Call once, before
  // any I/O; buffers must be 4 KiB aligned and outlive the tier.
  absl::Status RegisterBuffers(const std::vector<absl::Span<std::byte>>& buffers);

  const std::string& path() const { return path_; }

 private:
  struct Op;
  struct Part;
  struct ExtentState {
    uint64_t offset;
    uint64_t num_bytes;
    std::vector<uint64_t> checksums;  // per block
    std::vector<bool> written;        // per block
  };

  // The extent of the tier's own block 0 (start-up self-check).
  static constexpr uint64_t kProbeExtentId = 0;

  NvmeTier(std::string path, int fd, uint64_t budget_bytes, unsigned queue_depth,
           uint64_t max_io_bytes);
  absl::Status InitRing();
  // Checks offsets, sizes and alignment; the extent's file offset.
  absl::StatusOr<uint64_t> Check(const Extent& extent, uint64_t offset, const void* buffer,
                                 uint64_t num_bytes);
  void Submit(std::unique_ptr<Op> op);
  // Queues the part's remaining bytes and submits them.
  void Prepare(Part* part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sq_mu_);
  // Hands the kernel every queued request (storage/uring_submit.h).
  void SubmitQueuedParts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sq_mu_);
  // Records a part's outcome; the op's last part completes the op.
  void FinishPart(Part* part, absl::Status status);
  // A read part's blocks against the checksums its op took at submission:
  // DATA_LOSS naming the first block that differs. Lock-free: the
  // completion thread hashes while others submit and allocate.
  absl::Status VerifyPart(const Part& part) const;
  void CompletionLoop();
  void Complete(std::unique_ptr<Op> op, absl::Status status);
  int FixedBufferIndex(const void* data, uint64_t num_bytes) const;

  const std::string path_;
  const int fd_;
  const uint64_t budget_bytes_;
  std::atomic<uint64_t> read_bytes_{0}, written_bytes_{0};
  const unsigned queue_depth_;
  const uint64_t max_io_bytes_;

  mutable absl::Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  FreeRanges free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ExtentState> extents_ ABSL_GUARDED_BY(mu_);

  absl::Mutex sq_mu_;
  io_uring ring_;
  bool ring_ready_ = false;
  unsigned in_flight_ ABSL_GUARDED_BY(sq_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(sq_mu_) = false;
  std::vector<absl::Span<std::byte>> fixed_buffers_;
  std::thread completions_;
};

}  // namespace strata

#endif  // STRATA_STORAGE_NVME_TIER_H_
