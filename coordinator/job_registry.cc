#include "coordinator/job_registry.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job_info.h"
#include "core/status_macros.h"
#include "rpc/token.h"

namespace strata {
namespace {

constexpr char kServerPrefix[] = "server/";
constexpr char kJobPrefix[] = "job/";

template <typename Message>
absl::Status ParseInto(const std::string& key, const std::string& bytes, Message* message) {
  if (!message->ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("coordinator metadata: cannot parse record ", key));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status JobRegistry::Load() {
  ASSIGN_OR_RETURN(auto servers, metadata_->Scan(kServerPrefix));
  ASSIGN_OR_RETURN(auto jobs, metadata_->Scan(kJobPrefix));
  std::map<std::string, v1::ServerRecord> loaded_servers;
  for (const auto& [key, value] : servers) {
    v1::ServerRecord record;
    RETURN_IF_ERROR(ParseInto(key, value, &record));
    loaded_servers[record.address()] = std::move(record);
  }
  std::vector<v1::JobInfo> loaded_jobs(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    RETURN_IF_ERROR(ParseInto(jobs[i].first, jobs[i].second, &loaded_jobs[i]));
  }
  servers_ = std::move(loaded_servers);
  jobs_.clear();
  token_jobs_.clear();
  for (const v1::JobInfo& job : loaded_jobs) KeepJob(job);
  return absl::OkStatus();
}

const v1::ServerRecord* JobRegistry::FindServer(const std::string& address) const {
  auto it = servers_.find(address);
  return it == servers_.end() ? nullptr : &it->second;
}

const v1::JobInfo* JobRegistry::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::optional<std::string> JobRegistry::JobOfToken(absl::string_view digest) const {
  auto it = token_jobs_.find(digest);
  if (it == token_jobs_.end()) return std::nullopt;
  return it->second;
}

absl::Status JobRegistry::PutServer(const v1::ServerRecord& server) {
  RETURN_IF_ERROR(
      metadata_->Put(absl::StrCat(kServerPrefix, server.address()), server.SerializeAsString()));
  servers_[server.address()] = server;
  return absl::OkStatus();
}

absl::Status JobRegistry::PutJob(const v1::JobInfo& job) {
  RETURN_IF_ERROR(
      metadata_->Put(absl::StrCat(kJobPrefix, job.spec().job_id()), job.SerializeAsString()));
  KeepJob(job);
  return absl::OkStatus();
}

absl::Status JobRegistry::DeleteJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return UnknownJob(job_id);
  RETURN_IF_ERROR(metadata_->Delete(absl::StrCat(kJobPrefix, job_id)));
  if (!it->second.worker_token().empty()) {
    token_jobs_.erase(TokenDigest(it->second.worker_token()));
  }
  jobs_.erase(it);
  return absl::OkStatus();
}

void JobRegistry::KeepJob(const v1::JobInfo& job) {
  if (!job.worker_token().empty()) {
    token_jobs_[TokenDigest(job.worker_token())] = job.spec().job_id();
  }
  jobs_[job.spec().job_id()] = job;
}

}  // namespace strata
