#include "shard/chunk_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

constexpr uint64_t kBlockBytes = 4096;

uint64_t RoundUpToBlock(uint64_t n) { return (n + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }

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
    pool->free_.push_back(reinterpret_cast<std::byte*>(RoundUpToBlock(address)));
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

uint64_t NvmeChunkState::StagingBytes(StateShape shape) { return RoundUpToBlock(shape.bytes()); }

NvmeChunkState::NvmeChunkState(Tier* nvme, std::shared_ptr<StagingPool> staging, StateShape shape,
                               Extent slot0, Extent slot1, int current)
    : nvme_(nvme),
      staging_(std::move(staging)),
      shape_(shape),
      slot_bytes_(StagingBytes(shape)),
      slots_{slot0, slot1},
      current_(current) {}

absl::Status NvmeChunkState::Describe(internal::ChunkRecord* record) const {
  ASSIGN_OR_RETURN(std::vector<uint64_t> checksums, nvme_->Checksums(slots_[current_]));
  record->set_tier("nvme");
  record->clear_slot_offsets();
  record->add_slot_offsets(slots_[0].offset);
  record->add_slot_offsets(slots_[1].offset);
  record->set_slot_bytes(slot_bytes_);
  record->set_current_slot(current_);
  record->mutable_checksums()->Assign(checksums.begin(), checksums.end());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChunkState>> NvmeChunkState::Restore(
    NvmeTier* nvme, std::shared_ptr<StagingPool> staging, const internal::ChunkRecord& record,
    StatePrecision precision) {
  const StateShape shape{record.chunk().num_params(), precision};
  const uint64_t slot_bytes = StagingBytes(shape);
  if (record.slot_offsets_size() != 2 || record.slot_bytes() != slot_bytes ||
      record.current_slot() > 1) {
    return absl::DataLossError(
        absl::StrCat("chunk ", record.chunk().chunk_id(), ": malformed NVMe record"));
  }
  int current = static_cast<int>(record.current_slot());
  std::vector<uint64_t> checksums(record.checksums().begin(), record.checksums().end());
  Extent slots[2];
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(slots[i], nvme->Adopt(record.slot_offsets(i), slot_bytes,
                                           i == current ? checksums : std::vector<uint64_t>()));
  }
  return std::unique_ptr<ChunkState>(
      new NvmeChunkState(nvme, std::move(staging), shape, slots[0], slots[1], current));
}

absl::StatusOr<std::unique_ptr<ChunkState>> NvmeChunkState::Create(
    Tier* nvme, std::shared_ptr<StagingPool> staging, StateShape shape) {
  const uint64_t slot_bytes = StagingBytes(shape);
  ASSIGN_OR_RETURN(Extent slot0, nvme->Allocate(slot_bytes));
  absl::StatusOr<Extent> slot1 = nvme->Allocate(slot_bytes);
  if (!slot1.ok()) {
    nvme->Free(slot0);
    return slot1.status();
  }
  StagingPool* pool = staging.get();
  std::unique_ptr<NvmeChunkState> state(
      new NvmeChunkState(nvme, std::move(staging), shape, slot0, *slot1));
  // Slot 0 starts as zeros: p, m and v of a new chunk (8-bit moments: codes
  // and scales 0).
  std::byte* buffer = pool->Acquire();
  std::memset(buffer, 0, slot_bytes);
  absl::Status s = WriteAndWait(*nvme, slot0, 0, absl::MakeConstSpan(buffer, slot_bytes));
  pool->Release(buffer);
  RETURN_IF_ERROR(s);
  return std::unique_ptr<ChunkState>(std::move(state));
}

NvmeChunkState::~NvmeChunkState() {
  nvme_->Free(slots_[0]);
  nvme_->Free(slots_[1]);
}

StateView NvmeChunkState::ViewOf(std::byte* buffer) const { return shape_.ViewOf(buffer, buffer); }

absl::StatusOr<StateView> NvmeChunkState::Load() {
  std::byte* buffer = staging_->Acquire();
  absl::Status s = ReadAndWait(*nvme_, slots_[current_], 0, absl::MakeSpan(buffer, slot_bytes_));
  if (!s.ok()) {
    staging_->Release(buffer);
    return s;
  }
  return ViewOf(buffer);
}

absl::Status NvmeChunkState::Commit(const StateView& view) {
  int next = 1 - current_;
  RETURN_IF_ERROR(
      WriteAndWait(*nvme_, slots_[next], 0, absl::MakeConstSpan(view.buffer, slot_bytes_)));
  current_ = next;
  return absl::OkStatus();
}

void NvmeChunkState::Release(const StateView& view) { staging_->Release(view.buffer); }

}  // namespace strata
