// Chunk's record in the server's metadata store (chunk.h): where its state
// lies and the step it holds, written after each durable step so that a
// restarted server finds it (shard/recovery.cc).
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "shard/chunk.h"
#include "strata/internal/records.pb.h"

namespace strata {

std::string Chunk::RecordPrefix(const std::string& job_id) {
  return absl::StrCat("chunk/", job_id, "/");
}

std::string Chunk::RecordKey(const std::string& job_id, uint32_t chunk_id) {
  return absl::StrCat(RecordPrefix(job_id), absl::Dec(chunk_id, absl::kZeroPad8));
}

absl::Status Chunk::WriteRecordLocked(int64_t step) {
  if (metadata_ == nullptr || !state_->durable()) return absl::OkStatus();
  internal::ChunkRecord record;
  record.mutable_chunk()->set_chunk_id(chunk_id_);
  record.mutable_chunk()->set_flat_begin(range_.begin);
  record.mutable_chunk()->set_num_params(range_.size());
  RETURN_IF_ERROR(state_->Describe(&record));
  record.set_applied_step(step);
  return metadata_->Put(RecordKey(job_id_, chunk_id_), record.SerializeAsString(), /*sync=*/true);
}

absl::Status Chunk::WriteRecord() {
  absl::MutexLock state_lock(&state_mu_);
  return WriteRecordLocked(applied_step());
}

}  // namespace strata
