// RendezvousStore: the coordinator's key-value store (KvSet/KvGet) through
// which a job's workers form their collective groups. Keys and values are
// bytes, kept in RocksDB under "kv/"; every key belongs to a job -- it starts
// with RendezvousPrefix(job_id) (rpc/rendezvous_keys.h) -- and DeleteJob
// removes a job's keys with the job. The bytes of a job's keys and values,
// and of all of them, are bounded, so that no caller fills the coordinator's
// disk. Thread-safe.
#ifndef STRATA_COORDINATOR_RENDEZVOUS_STORE_H_
#define STRATA_COORDINATOR_RENDEZVOUS_STORE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/metadata_store.h"

namespace strata {

class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  // Key and value bytes one job's keys may hold, and all jobs' together.
  static constexpr uint64_t kMaxJobBytes = uint64_t{64} << 20;
  static constexpr uint64_t kMaxTotalBytes = uint64_t{1} << 30;

  // `metadata` must outlive the store.
  explicit RendezvousStore(MetadataStore* metadata) : metadata_(metadata) {}

  // Counts the keys a previous run left, before the first Set.
  absl::Status Load();
  // INVALID_ARGUMENT for a key that is not a job's ("job/<id>/..."), or a
  // key or value over its limit; RESOURCE_EXHAUSTED when the job's or all
  // jobs' bytes would pass their bound; the store's error when the write
  // fails. A refused Set changes nothing.
  absl::Status Set(const std::string& key, const std::string& value);
  // The value; NOT_FOUND for a key not set (or deleted with its job).
  absl::StatusOr<std::string> Get(const std::string& key);
  // Deletes every key of `job_id`, atomically.
  absl::Status DeleteJob(const std::string& job_id);

 private:
  // The job `key` belongs to; INVALID_ARGUMENT for a key of none.
  static absl::StatusOr<std::string> JobOf(const std::string& key);

  MetadataStore* const metadata_;
  absl::Mutex mu_;  // held across a Set's check and write
  absl::flat_hash_map<std::string, uint64_t> job_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_RENDEZVOUS_STORE_H_
