#include "coordinator/rendezvous_store.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/job_spec.h"
#include "rpc/rendezvous_keys.h"

namespace strata {
namespace {

constexpr char kKvPrefix[] = "kv/";

}  // namespace

absl::StatusOr<std::string> RendezvousStore::JobOf(const std::string& key) {
  std::string job_id = JobOfRendezvousKey(key);
  if (!IsValidId(job_id)) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quoted(key),
                                                   " is not a job's: keys start with ",
                                                   kRendezvousJobsPrefix, "<job id>/"));
  }
  return job_id;
}

absl::Status RendezvousStore::Load() {
  ASSIGN_OR_RETURN(auto records, metadata_->Scan(kKvPrefix));
  absl::MutexLock lock(&mu_);
  for (const auto& [key, value] : records) {
    const std::string kv_key = key.substr(sizeof(kKvPrefix) - 1);
    const uint64_t bytes = kv_key.size() + value.size();
    absl::StatusOr<std::string> job = JobOf(kv_key);
    if (job.ok()) job_bytes_[*job] += bytes;
    total_bytes_ += bytes;
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key must have 1 to ", kMaxKeyBytes, " bytes"));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", value.size(), " bytes exceeds the maximum of ", kMaxValueBytes));
  }
  ASSIGN_OR_RETURN(const std::string job_id, JobOf(key));
  const std::string stored_key = absl::StrCat(kKvPrefix, key);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::optional<std::string> old, metadata_->Get(stored_key));
  const uint64_t old_bytes = old.has_value() ? key.size() + old->size() : 0;
  const uint64_t new_bytes = key.size() + value.size();
  const auto it = job_bytes_.find(job_id);
  const uint64_t job_bytes = it == job_bytes_.end() ? 0 : it->second;
  if (job_bytes - old_bytes + new_bytes > kMaxJobBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("job ", Quoted(job_id), "'s keys hold ",
                                                     job_bytes, " bytes; this value would pass ",
                                                     "the bound of ", kMaxJobBytes));
  }
  if (total_bytes_ - old_bytes + new_bytes > kMaxTotalBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the rendezvous store holds ", total_bytes_,
                                                     " bytes; the bound is ", kMaxTotalBytes));
  }
  RETURN_IF_ERROR(metadata_->Put(stored_key, value));
  job_bytes_[job_id] = job_bytes - old_bytes + new_bytes;
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key) {
  ASSIGN_OR_RETURN(std::optional<std::string> value, metadata_->Get(absl::StrCat(kKvPrefix, key)));
  if (!value.has_value()) return absl::NotFoundError(absl::StrCat("no key ", Quoted(key)));
  return *std::move(value);
}

absl::Status RendezvousStore::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(metadata_->DeletePrefix(absl::StrCat(kKvPrefix, RendezvousPrefix(job_id))));
  if (auto it = job_bytes_.find(job_id); it != job_bytes_.end()) {
    total_bytes_ -= it->second;
    job_bytes_.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace strata
