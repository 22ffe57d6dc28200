// JobRegistry: the coordinator's record of its shard servers and jobs, and
// their persistence. Every change is written to the metadata store before
// the registry shows it (RocksDB's log, not synced: it survives the
// coordinator's process, not its machine's crash), so what a client was
// answered survives a restart; Load() reads the records back. Jobs are also found by the digest
// of their worker token (rpc/token.h).
// Thread-compatible: the coordinator's mutex guards it.
#ifndef STRATA_COORDINATOR_JOB_REGISTRY_H_
#define STRATA_COORDINATOR_JOB_REGISTRY_H_

#include <map>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/metadata_store.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

class JobRegistry {
 public:
  // `metadata` must outlive the registry.
  explicit JobRegistry(MetadataStore* metadata) : metadata_(metadata) {}
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Replaces what the registry holds with the records in the metadata store.
  // DATA_LOSS naming the record that does not parse.
  absl::Status Load();

  // By address and by job id.
  const std::map<std::string, v1::ServerRecord>& servers() const { return servers_; }
  const std::map<std::string, v1::JobInfo>& jobs() const { return jobs_; }
  // Null when there is none.
  const v1::ServerRecord* FindServer(const std::string& address) const;
  const v1::JobInfo* FindJob(const std::string& job_id) const;
  // The job whose worker token has `digest`.
  std::optional<std::string> JobOfToken(absl::string_view digest) const;

  // Records (or replaces) a server, a job. The store's error leaves the
  // registry as it was.
  absl::Status PutServer(const v1::ServerRecord& server);
  absl::Status PutJob(const v1::JobInfo& job);
  // Forgets a job: NOT_FOUND when there is none; the store's error leaves it.
  absl::Status DeleteJob(const std::string& job_id);

 private:
  void KeepJob(const v1::JobInfo& job);

  MetadataStore* const metadata_;
  std::map<std::string, v1::ServerRecord> servers_;
  std::map<std::string, v1::JobInfo> jobs_;
  absl::flat_hash_map<std::string, std::string> token_jobs_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_JOB_REGISTRY_H_
