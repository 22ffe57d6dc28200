// ShardService's placement of a job's chunks over the tiers (shard_service.h):
// GPU memory first, then host memory, then NVMe.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rpc/job_spec.h"
#include "shard/gpu_chunk_state.h"
#include "shard/shard_service.h"

namespace strata {

absl::StatusOr<std::unique_ptr<StagingPool>> ShardService::MakeStagingPool(
    const v1::JobSpec& spec) {
  return StagingPool::Create(
      host_, NvmeChunkState::StagingBytes({spec.chunk_num_params(), StatePrecisionOf(spec)}),
      staging_buffers_);
}

std::vector<Tier*> ShardService::Tiers() const {
  std::vector<Tier*> tiers;
  for (Tier* tier : {gpu_, host_, static_cast<Tier*>(nvme_)}) {
    if (tier != nullptr) tiers.push_back(tier);
  }
  return tiers;
}

absl::StatusOr<std::unique_ptr<ChunkState>> ShardService::MakeMemoryState(
    const v1::JobSpec& spec, StateShape shape, DType dtype,
    std::shared_ptr<StagingPool>* gpu_staging, bool to_fill) {
  if (gpu_ != nullptr && *gpu_staging == nullptr) {
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(
        host_, GpuStagingBytes(spec.chunk_num_params(), dtype), executor_->num_threads() + 1);
    if (pool.ok()) *gpu_staging = *std::move(pool);
  }
  if (*gpu_staging != nullptr) {
    absl::StatusOr<std::unique_ptr<ChunkState>> state =
        CreateGpuChunkState(gpu_, *gpu_staging, shape, dtype);
    if (state.ok() || state.status().code() != absl::StatusCode::kResourceExhausted) return state;
  }
  return HostChunkState::Create(host_, shape, to_fill);
}

absl::Status ShardService::PlaceChunks(const v1::AllocateChunksRequest& request,
                                       const FlatLayout& layout, DType dtype,
                                       std::shared_ptr<StagingPool> staging, ShardJob* job) {
  const std::string& job_id = request.spec().job_id();
  const AdamConfig adam = AdamFromProto(request.spec().adam());
  const StatePrecision precision = StatePrecisionOf(request.spec());
  // Copies first: every chunk's copy is in host memory whatever its tier.
  // Chunks that a load or a seed fills are settled after it
  // (Chunk::SettleState): their pages are faulted in by the writes that
  // fill them, not cleared once more ahead of those.
  const std::set<uint32_t> seeded = SeededChunkIds(request);
  auto to_fill = [&](const v1::ChunkSpec& c) {
    return request.loads_checkpoint() || seeded.count(c.chunk_id()) > 0;
  };
  std::vector<Extent> copies;
  std::shared_ptr<StagingPool> gpu_staging;  // made for the first GPU chunk
  absl::Status status;
  for (const v1::ChunkSpec& c : request.chunks()) {
    const uint64_t copy_bytes = ChunkCopyBytes(c.num_params(), dtype);
    absl::StatusOr<Extent> copy =
        to_fill(c) ? host_->AllocateToFill(copy_bytes) : host_->Allocate(copy_bytes);
    if (!copy.ok()) {
      status = copy.status();
      break;
    }
    copies.push_back(*copy);
  }
  for (int i = 0; status.ok() && i < request.chunks_size(); ++i) {
    const v1::ChunkSpec& c = request.chunks(i);
    const StateShape shape{c.num_params(), precision};
    absl::StatusOr<std::unique_ptr<ChunkState>> state =
        MakeMemoryState(request.spec(), shape, dtype, &gpu_staging, to_fill(c));
    if (!state.ok() && staging != nullptr)
      state = NvmeChunkState::Create(nvme_slots_.get(), staging, shape);
    if (!state.ok()) {
      status = state.status();
      break;
    }
    const FlatRange range{c.flat_begin(), c.flat_begin() + c.num_params()};
    job->chunks_by_begin[c.flat_begin()] = std::make_shared<Chunk>(
        job_id, c.chunk_id(), range, dtype, adam, *std::move(state), host_, copies[i], metadata_,
        /*applied_step=*/0, ChunkGroupsOf(request.spec(), layout, range));
  }
  if (!status.ok()) {
    // Chunks made so far free their copies; the rest are freed here.
    for (size_t i = job->chunks_by_begin.size(); i < copies.size(); ++i) host_->Free(copies[i]);
    job->chunks_by_begin.clear();
  }
  return status;
}

}  // namespace strata
