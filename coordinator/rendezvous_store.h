// RendezvousStore: the coordinator's key-value store (KvSet/KvGet) through
// which a job's workers form their collective groups. Keys and values are
// bytes, kept in RocksDB under "kv/"; the keys of a job are those that start
// with RendezvousPrefix(job_id) (rpc/rendezvous_keys.h), and DeleteJob removes
// them with the job. Thread-safe (RocksDB is).
#ifndef STRATA_COORDINATOR_RENDEZVOUS_STORE_H_
#define STRATA_COORDINATOR_RENDEZVOUS_STORE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/metadata_store.h"

namespace strata {

class RendezvousStore {
 public:
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 1 << 20;

  // `metadata` must outlive the store.
  explicit RendezvousStore(MetadataStore* metadata) : metadata_(metadata) {}

  // INVALID_ARGUMENT for an empty key, or a key or value over its limit; the
  // store's error when the write fails.
  absl::Status Set(const std::string& key, const std::string& value);
  // The value; NOT_FOUND for a key not set (or deleted with its job).
  absl::StatusOr<std::string> Get(const std::string& key);
  // Deletes every key of `job_id`, atomically.
  absl::Status DeleteJob(const std::string& job_id);

 private:
  MetadataStore* const metadata_;
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_RENDEZVOUS_STORE_H_
