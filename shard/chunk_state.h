// ChunkState: where the state (p, m, v; state_view.h) of one chunk lives, and how it
// is brought into memory for an update and put back.
//
//  - HostChunkState: in a host-tier extent; Load() gives pointers into it and
//    Commit() has nothing to do.
//  - NvmeChunkState: in an NVMe-tier slot (nvme_slots.h). Load() reads it
//    into a staging buffer of a StagingPool; Commit() writes the updated
//    state to a spare slot of its size and only then makes it current, so
//    a failed or torn write leaves the previous state intact; the old slot
//    becomes the spare once the chunk's record names the new one (Retire).
//  - GpuChunkState (server/gpu_chunk_state.h): in GPU memory, updated there
//    by Update(); Load()/Commit() copy it to and from host memory for the
//    rarer reads and writes.
//
// Not thread-safe: the owning Chunk serializes Load/Commit/Release (one
// update or read at a time). StagingPool is thread-safe.
#ifndef STRATA_SHARD_CHUNK_STATE_H_
#define STRATA_SHARD_CHUNK_STATE_H_

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "core/chunk_bytes.h"
#include "kernels/adam.h"
#include "shard/chunk_groups.h"
#include "shard/nvme_slots.h"
#include "shard/state_view.h"
#include "storage/nvme_tier.h"
#include "storage/tier.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/shard.pb.h"

namespace strata {

// Page-locked staging buffers of one size, taken from the host tier.
class StagingPool {
 public:
  // RESOURCE_EXHAUSTED when `count` buffers of `buffer_bytes` do not fit.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(Tier* host, uint64_t buffer_bytes,
                                                             int count);
  ~StagingPool();
  // Waits for a free buffer.
  std::byte* Acquire();
  void Release(std::byte* buffer);

 private:
  explicit StagingPool(Tier* host) : host_(host) {}
  Tier* const host_;
  std::vector<Extent> extents_;
  absl::Mutex mu_;
  std::vector<std::byte*> free_ ABSL_GUARDED_BY(mu_);
};

class ChunkState {
 public:
  virtual ~ChunkState() = default;
  virtual TierKind tier() const = 0;
  virtual StateShape shape() const = 0;
  // Tier bytes the state holds.
  virtual uint64_t num_bytes() const = 0;
  // The state in memory; an I/O error leaves nothing to release.
  virtual absl::StatusOr<StateView> Load() = 0;
  // Makes the view's state the state. On error the previous state stays.
  virtual absl::Status Commit(const StateView& view) = 0;
  // Ends a Load(), committed or not.
  virtual void Release(const StateView& view) = 0;
  // Whether the state survives a restart; if so, Describe() fills the
  // tier's part of the chunk's record after each Commit(), and Rollback()
  // undoes the last Commit() when that record could not be written. Retire()
  // follows a Commit() whose record is written (or that needs none): what
  // the state kept to undo it goes.
  virtual bool durable() const { return false; }
  virtual absl::Status Describe(internal::ChunkRecord*) const { return absl::OkStatus(); }
  virtual void Rollback() {}
  virtual void Retire() {}
  // Makes a state created to be filled (a restore's load) what others are:
  // pinned where its tier pins (Tier::Settle); the tier's refusal otherwise.
  virtual absl::Status Settle() { return absl::OkStatus(); }
  // Whether the tier computes the update where the state lives (GPU):
  // Update() then takes the place of Load(), a CPU update and Commit().
  virtual bool updates_in_tier() const { return false; }
  // Applies AdamW with each span's constants (the spans cover the chunk)
  // from `grads` (together covering the chunk, in order, in the job's dtype,
  // which such a state is made with) and writes the new p in that dtype to
  // `copy` (host memory). An 8-bit state rounds as ApplyAdamStep does step
  // `step` of a chunk whose first parameter is `flat_begin` in the model.
  virtual absl::Status Update(absl::Span<const ConstantsSpan> /*spans*/,
                              absl::Span<const GradRange> /*grads*/, std::byte* /*copy*/,
                              uint64_t /*flat_begin*/, int64_t /*step*/) {
    return absl::UnimplementedError("this chunk state is updated through Load() and Commit()");
  }
};

class HostChunkState : public ChunkState {
 public:
  // RESOURCE_EXHAUSTED when the state does not fit in `host`. With
  // `to_fill`, the state is about to be written whole and is settled after
  // (Tier::AllocateToFill).
  static absl::StatusOr<std::unique_ptr<ChunkState>> Create(Tier* host, StateShape shape,
                                                            bool to_fill = false);
  ~HostChunkState() override;
  TierKind tier() const override { return TierKind::kHost; }
  StateShape shape() const override { return shape_; }
  uint64_t num_bytes() const override { return extent_.num_bytes; }
  absl::StatusOr<StateView> Load() override;
  absl::Status Commit(const StateView&) override { return absl::OkStatus(); }
  void Release(const StateView&) override {}
  absl::Status Settle() override { return host_->Settle(extent_); }

 private:
  HostChunkState(Tier* host, Extent extent, StateShape shape)
      : host_(host), extent_(extent), shape_(shape) {}
  Tier* const host_;
  const Extent extent_;
  const StateShape shape_;
};

class NvmeChunkState : public ChunkState {
 public:
  // Staging bytes one chunk of `shape` needs: its state rounded to 4 KiB blocks.
  static uint64_t StagingBytes(StateShape shape);
  // A slot from `slots`, written with zeros. RESOURCE_EXHAUSTED when it
  // does not fit; the tier's error when the first write fails.
  static absl::StatusOr<std::unique_ptr<ChunkState>> Create(NvmeSlots* slots,
                                                            std::shared_ptr<StagingPool> staging,
                                                            StateShape shape);
  ~NvmeChunkState() override;
  TierKind tier() const override { return TierKind::kNvme; }
  StateShape shape() const override { return shape_; }
  uint64_t num_bytes() const override { return slot_bytes_; }
  absl::StatusOr<StateView> Load() override;
  absl::Status Commit(const StateView& view) override;
  void Release(const StateView& view) override;
  bool durable() const override { return true; }
  absl::Status Describe(internal::ChunkRecord* record) const override;
  void Rollback() override;
  void Retire() override;

  // The state of `precision` a previous run recorded: its slot is adopted
  // from `nvme`, the tier of `slots`.
  static absl::StatusOr<std::unique_ptr<ChunkState>> Restore(NvmeTier* nvme, NvmeSlots* slots,
                                                             std::shared_ptr<StagingPool> staging,
                                                             const internal::ChunkRecord& record,
                                                             StatePrecision precision);

 private:
  NvmeChunkState(NvmeSlots* slots, std::shared_ptr<StagingPool> staging, StateShape shape,
                 Extent slot);
  StateView ViewOf(std::byte* buffer) const;

  NvmeSlots* const slots_;
  const std::shared_ptr<StagingPool> staging_;
  const StateShape shape_;
  const uint64_t slot_bytes_;
  Extent current_;
  // The slot before the last Commit(), until Retire() or Rollback().
  std::optional<Extent> previous_;
};

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_STATE_H_
