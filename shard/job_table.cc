#include "shard/job_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr char kJobPrefix[] = "job/";

}  // namespace

ShardJob* JobTable::Find(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

std::optional<std::string> JobTable::JobOfToken(absl::string_view digest) const {
  auto it = token_jobs_.find(digest);
  if (it == token_jobs_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::shared_ptr<ShardJob>> JobTable::All() const {
  std::vector<std::shared_ptr<ShardJob>> all;
  all.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) all.push_back(job);
  return all;
}

void JobTable::Add(std::shared_ptr<ShardJob> job) {
  if (const std::string& digest = job->record.worker_token_sha256(); !digest.empty()) {
    token_jobs_[digest] = job->record.spec().job_id();
  }
  jobs_[job->record.spec().job_id()] = std::move(job);
}

std::shared_ptr<ShardJob> JobTable::Remove(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return nullptr;
  std::shared_ptr<ShardJob> job = std::move(it->second);
  jobs_.erase(it);
  token_jobs_.erase(job->record.worker_token_sha256());
  return job;
}

absl::StatusOr<std::vector<v1::AllocateChunksRequest>> ReadJobRecords(MetadataStore* metadata) {
  ASSIGN_OR_RETURN(auto stored, metadata->Scan(kJobPrefix));
  std::vector<v1::AllocateChunksRequest> records(stored.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    if (!records[i].ParseFromString(stored[i].second)) {
      return absl::DataLossError(
          absl::StrCat("server metadata: cannot parse record ", stored[i].first));
    }
  }
  return records;
}

absl::Status WriteJobRecord(MetadataStore* metadata, const v1::AllocateChunksRequest& record) {
  return metadata->Put(absl::StrCat(kJobPrefix, record.spec().job_id()),
                       record.SerializeAsString());
}

absl::Status DeleteJobRecords(MetadataStore* metadata, const std::string& job_id) {
  RETURN_IF_ERROR(metadata->Delete(absl::StrCat(kJobPrefix, job_id)));
  return metadata->DeletePrefix(Chunk::RecordPrefix(job_id));
}

std::set<uint32_t> SeededChunkIds(const v1::AllocateChunksRequest& request) {
  return std::set<uint32_t>(request.seeded_chunk_ids().begin(), request.seeded_chunk_ids().end());
}

}  // namespace strata
