// ShardService's recovery (shard_service.h): a clean shutdown saves the chunk
// states in memory, and a start-up rebuilds the jobs a previous run recorded.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/job_spec.h"
#include "shard/saved_chunk.h"
#include "shard/shard_service.h"
#include "strata/internal/records.pb.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ChunkState>> ShardService::RecoverState(
    const v1::JobSpec& spec, const internal::ChunkRecord& record, DType dtype,
    StagingPools* pools) {
  const StatePrecision precision = StatePrecisionOf(spec);
  const StateShape shape{record.chunk().num_params(), precision};
  if (record.saved_file().empty()) {
    if (nvme_ == nullptr) {
      return absl::FailedPreconditionError("its chunks were on an NVMe tier this server lacks");
    }
    if (pools->nvme == nullptr) {
      ASSIGN_OR_RETURN(pools->nvme, MakeStagingPool(spec));
    }
    return NvmeChunkState::Restore(nvme_, nvme_slots_.get(), pools->nvme, record, precision);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ChunkState> state,
                   MakeMemoryState(spec, shape, dtype, &pools->gpu, /*to_fill=*/true));
  ASSIGN_OR_RETURN(StateView view, state->Load());
  absl::Status loaded =
      LoadChunkState(record.saved_file(), record.saved_checksum(), shape.bytes(), view.bytes());
  if (loaded.ok()) loaded = state->Commit(view);
  state->Release(view);
  if (loaded.ok()) loaded = state->Settle();
  RETURN_IF_ERROR(loaded);
  return state;
}

absl::Status ShardService::Recover(const v1::AllocateChunksRequest& request) {
  const std::string& job_id = request.spec().job_id();
  ASSIGN_OR_RETURN(auto records, metadata_->Scan(Chunk::RecordPrefix(job_id)));
  if (records.size() != static_cast<size_t>(request.chunks_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.chunks_size() - static_cast<int>(records.size()),
                     " of its chunks were in host memory, which survives only a clean shutdown"));
  }
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request.spec().dtype()));
  StagingPools pools;
  auto job = std::make_shared<ShardJob>();
  job->record = request;
  job->dtype = dtype;
  const AdamConfig adam = AdamFromProto(request.spec().adam());
  ASSIGN_OR_RETURN(FlatLayout layout, ValidateJobSpec(request.spec()));
  int64_t step = -1;
  std::vector<std::string> saved_files, copy_files;  // removed once recovered
  for (const auto& [key, value] : records) {
    internal::ChunkRecord record;
    if (!record.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("server metadata: cannot parse record ", key));
    }
    const uint64_t n = record.chunk().num_params();
    ASSIGN_OR_RETURN(std::unique_ptr<ChunkState> state,
                     RecoverState(request.spec(), record, dtype, &pools));
    if (!record.saved_file().empty()) saved_files.push_back(record.saved_file());
    ASSIGN_OR_RETURN(Extent copy, host_->Allocate(ChunkCopyBytes(n, dtype)));
    uint64_t begin = record.chunk().flat_begin();
    const FlatRange range{begin, begin + n};
    auto chunk = std::make_shared<Chunk>(
        job_id, record.chunk().chunk_id(), range, dtype, adam, std::move(state), host_, copy,
        metadata_, record.applied_step(), ChunkGroupsOf(request.spec(), layout, range));
    RETURN_IF_ERROR(chunk->RebuildCopy());
    if (!record.previous_copy_file().empty()) {
      // Without it the chunk serves on; only a torn step could not be recomputed.
      absl::StatusOr<std::string> previous = LoadBytes(
          record.previous_copy_file(), record.previous_copy_checksum(), n * DTypeSize(dtype));
      absl::Status restored =
          previous.ok() ? chunk->RestorePreviousCopy(*previous) : previous.status();
      if (!restored.ok()) {
        LogEventCat("server", "job ", job_id, ": the copy of the step before chunk ",
                    record.chunk().chunk_id(), "'s is lost: ", restored.ToString());
      }
      copy_files.push_back(record.previous_copy_file());
    }
    job->chunks_by_begin[begin] = std::move(chunk);
    step = step < 0 ? record.applied_step() : std::min(step, record.applied_step());
  }
  // The saved states live in memory again: their records and files go, so
  // that a later crash cannot bring back these steps.
  for (const auto& [begin, chunk] : job->chunks_by_begin) {
    if (chunk->tier() != TierKind::kNvme) {
      RETURN_IF_ERROR(metadata_->Delete(Chunk::RecordKey(job_id, chunk->chunk_id())));
    }
  }
  for (const std::string& file : saved_files) std::filesystem::remove(file);
  for (const std::string& file : copy_files) std::filesystem::remove(file);
  absl::MutexLock lock(&mu_);
  AddJob(std::move(job));
  LogEventCat("server", "recovered job ", job_id, ": ", records.size() - saved_files.size(),
              " chunks from the nvme tier and ", saved_files.size(),
              " saved at the last clean shutdown, at step ", step);
  return absl::OkStatus();
}

// Saves `chunk` (of `job_id`, from flat index `begin`) in saved_chunks_dir_
// -- its state, and the copy of the step before where it is kept -- and
// commits its record.
absl::Status ShardService::SaveMemoryChunk(const std::string& job_id, uint64_t begin,
                                           Chunk& chunk) {
  const uint64_t n = chunk.range().size();
  const uint64_t bytes = chunk.state_shape().bytes();
  StateBuffer state = AllocateStateBuffer(bytes);
  ASSIGN_OR_RETURN(int64_t step, chunk.CopyState(chunk.range().begin, n, state.get()));
  const std::string file = absl::StrCat(saved_chunks_dir_, "/", job_id, "-", chunk.chunk_id());
  internal::ChunkRecord record;
  ASSIGN_OR_RETURN(uint64_t checksum, SaveChunkState(file, state.get(), bytes));
  record.mutable_chunk()->set_chunk_id(chunk.chunk_id());
  record.mutable_chunk()->set_flat_begin(begin);
  record.mutable_chunk()->set_num_params(n);
  record.set_tier(TierKindName(TierKind::kHost));
  record.set_saved_file(file);
  record.set_saved_checksum(checksum);
  record.set_applied_step(step);
  if (const std::string previous = chunk.PreviousCopy(); !previous.empty()) {
    const std::string copy_file = file + ".previous-copy";
    ASSIGN_OR_RETURN(uint64_t copy_checksum, SaveBytes(copy_file, previous));
    record.set_previous_copy_file(copy_file);
    record.set_previous_copy_checksum(copy_checksum);
  }
  return metadata_->Put(Chunk::RecordKey(job_id, chunk.chunk_id()), record.SerializeAsString(),
                        /*sync=*/true);
}

void ShardService::SaveMemoryChunks() {
  std::vector<std::shared_ptr<ShardJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = jobs_.All();
  }
  for (const auto& job : jobs) {
    const std::string& job_id = job->record.spec().job_id();
    int saved = 0;
    absl::Status status;
    for (const auto& [begin, chunk] : job->chunks_by_begin) {
      if (chunk->tier() == TierKind::kNvme) continue;  // durable already
      status = SaveMemoryChunk(job_id, begin, *chunk);
      if (!status.ok()) break;
      ++saved;
    }
    if (!status.ok()) {
      LogEventCat("server", "job ", job_id, ": cannot save its chunks held in memory (",
                  status.ToString(), "); the job will be discarded at the next start");
    } else if (saved > 0) {
      LogEventCat("server", "job ", job_id, ": saved ", saved, " chunk(s) held in memory to ",
                  saved_chunks_dir_);
    }
  }
}

}  // namespace strata
