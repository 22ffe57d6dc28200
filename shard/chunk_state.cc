#include "shard/chunk_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/round_up.h"
#include "core/status_macros.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

constexpr uint64_t kBlockBytes = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(Tier* host, uint64_t buffer_bytes,
                                                                 int count) {
  std::unique_ptr<StagingPool> pool(new StagingPool(host));
  for (int i = 0; i < count; ++i) {
    // One block more than asked, so that the buffer can start 4 KiB aligned.
    absl::StatusOr<Extent> extent = host->Allocate(buffer_bytes + kBlockBytes);
    if (!extent.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("staging buffers for the NVMe tier: ", extent.status().message()));
    }
    pool->extents_.push_back(*extent);
    auto address = reinterpret_cast<uintptr_t>(host->Map(*extent));
    absl::MutexLock lock(&pool->mu_);
    pool->free_.push_back(reinterpret_cast<std::byte*>(RoundUp(address, kBlockBytes)));
  }
  return pool;
}

StagingPool::~StagingPool() {
  for (const Extent& e : extents_) host_->Free(e);
}

std::byte* StagingPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<std::byte*>* free) { return !free->empty(); }, &free_));
  std::byte* buffer = free_.back();
  free_.pop_back();
  return buffer;
}

void StagingPool::Release(std::byte* buffer) {
  absl::MutexLock lock(&mu_);
  free_.push_back(buffer);
}

absl::StatusOr<std::unique_ptr<ChunkState>> HostChunkState::Create(Tier* host, StateShape shape,
                                                                   bool to_fill) {
  ASSIGN_OR_RETURN(Extent extent,
                   to_fill ? host->AllocateToFill(shape.bytes()) : host->Allocate(shape.bytes()));
  return std::unique_ptr<ChunkState>(new HostChunkState(host, extent, shape));
}

HostChunkState::~HostChunkState() { host_->Free(extent_); }

absl::StatusOr<StateView> HostChunkState::Load() { return shape_.ViewOf(host_->Map(extent_)); }

uint64_t NvmeChunkState::StagingBytes(StateShape shape) {
  return RoundUp(shape.bytes(), kBlockBytes);
}

NvmeChunkState::NvmeChunkState(NvmeSlots* slots, std::shared_ptr<StagingPool> staging,
                               StateShape shape, Extent slot)
    : slots_(slots),
      staging_(std::move(staging)),
      shape_(shape),
      slot_bytes_(StagingBytes(shape)),
      current_(slot) {}

absl::Status NvmeChunkState::Describe(internal::ChunkRecord* record) const {
  ASSIGN_OR_RETURN(std::vector<uint64_t> checksums, slots_->tier()->Checksums(current_));
  record->set_tier("nvme");
  record->clear_slot_offsets();
  record->add_slot_offsets(current_.offset);
  record->set_slot_bytes(slot_bytes_);
  record->set_current_slot(0);
  record->mutable_checksums()->Assign(checksums.begin(), checksums.end());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChunkState>> NvmeChunkState::Restore(
    NvmeTier* nvme, NvmeSlots* slots, std::shared_ptr<StagingPool> staging,
    const internal::ChunkRecord& record, StatePrecision precision) {
  const StateShape shape{record.chunk().num_params(), precision};
  const uint64_t slot_bytes = StagingBytes(shape);
  // One slot; records of two fixed slots, one current, come from earlier
  // versions (the other slot's bytes are free now).
  if (record.slot_offsets_size() < 1 || record.slot_offsets_size() > 2 ||
      record.slot_bytes() != slot_bytes ||
      record.current_slot() >= static_cast<uint32_t>(record.slot_offsets_size())) {
    return absl::DataLossError(
        absl::StrCat("chunk ", record.chunk().chunk_id(), ": malformed NVMe record"));
  }
  std::vector<uint64_t> checksums(record.checksums().begin(), record.checksums().end());
  ASSIGN_OR_RETURN(Extent slot,
                   nvme->Adopt(record.slot_offsets(static_cast<int>(record.current_slot())),
                               slot_bytes, checksums));
  slots->Adopted(slot);
  return std::unique_ptr<ChunkState>(new NvmeChunkState(slots, std::move(staging), shape, slot));
}

absl::StatusOr<std::unique_ptr<ChunkState>> NvmeChunkState::Create(
    NvmeSlots* slots, std::shared_ptr<StagingPool> staging, StateShape shape) {
  const uint64_t slot_bytes = StagingBytes(shape);
  ASSIGN_OR_RETURN(Extent slot, slots->Allocate(slot_bytes));
  StagingPool* pool = staging.get();
  std::unique_ptr<NvmeChunkState> state(new NvmeChunkState(slots, std::move(staging), shape, slot));
  // The slot starts as zeros: p, m and v of a new chunk (8-bit moments:
  // codes and scales 0).
  std::byte* buffer = pool->Acquire();
  std::memset(buffer, 0, slot_bytes);
  absl::Status s = WriteAndWait(*slots->tier(), slot, 0, absl::MakeConstSpan(buffer, slot_bytes));
  pool->Release(buffer);
  RETURN_IF_ERROR(s);
  return std::unique_ptr<ChunkState>(std::move(state));
}

NvmeChunkState::~NvmeChunkState() {
  Retire();
  slots_->Free(current_);
}

StateView NvmeChunkState::ViewOf(std::byte* buffer) const { return shape_.ViewOf(buffer, buffer); }

absl::StatusOr<StateView> NvmeChunkState::Load() {
  std::byte* buffer = staging_->Acquire();
  absl::Status s = ReadAndWait(*slots_->tier(), current_, 0, absl::MakeSpan(buffer, slot_bytes_));
  if (!s.ok()) {
    staging_->Release(buffer);
    return s;
  }
  return ViewOf(buffer);
}

absl::Status NvmeChunkState::Commit(const StateView& view) {
  Retire();
  ASSIGN_OR_RETURN(Extent next, slots_->BeginCommit(slot_bytes_));
  absl::Status written =
      WriteAndWait(*slots_->tier(), next, 0, absl::MakeConstSpan(view.buffer, slot_bytes_));
  if (!written.ok()) {
    slots_->EndCommit(next);
    return written;
  }
  previous_ = current_;
  current_ = next;
  return absl::OkStatus();
}

void NvmeChunkState::Retire() {
  if (!previous_.has_value()) return;
  slots_->EndCommit(*previous_);
  previous_.reset();
}

void NvmeChunkState::Rollback() {
  if (!previous_.has_value()) return;
  slots_->EndCommit(current_);
  current_ = *previous_;
  previous_.reset();
}

void NvmeChunkState::Release(const StateView& view) { staging_->Release(view.buffer); }

}  // namespace strata
