// MetadataStore: a small key-value store on RocksDB for the metadata of the
// coordinator and the shard servers. Keys are strings; values are serialized
// protobufs or plain bytes. Thread-safe. Every error is a
// absl::Status naming the path and the operation.
#ifndef STRATA_STORAGE_METADATA_STORE_H_
#define STRATA_STORAGE_METADATA_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace rocksdb {
class DB;
}

namespace strata {

class MetadataStore {
 public:
  // Opens (creating if missing) the database in directory `path`.
  static absl::StatusOr<std::unique_ptr<MetadataStore>> Open(const std::string& path);
  // Opens the database of a daemon whose data directory is `data_dir`
  // (data_dir/metadata), creating the directory if missing; INVALID_ARGUMENT
  // for an empty `data_dir`, FAILED_PRECONDITION when it cannot be created.
  static absl::StatusOr<std::unique_ptr<MetadataStore>> OpenInDataDir(const std::string& data_dir);
  ~MetadataStore();

  // With `sync`, the write is on disk when Put returns.
  absl::Status Put(absl::string_view key, absl::string_view value, bool sync = false);
  // std::nullopt when the key is absent.
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view key);
  absl::Status Delete(absl::string_view key);
  // Deletes every key that starts with `prefix`, atomically.
  absl::Status DeletePrefix(absl::string_view prefix);
  // Every (key, value) whose key starts with `prefix`, in key order.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(absl::string_view prefix);
  // Closes the database and opens it again. After a failed write RocksDB
  // refuses every write (a sticky error its Resume() does not clear for the
  // write-ahead log); reopened once the storage takes writes, it replays its
  // log and serves again. Until a Reopen() succeeds every call is UNAVAILABLE.
  absl::Status Reopen();

 private:
  MetadataStore(std::string path, std::unique_ptr<rocksdb::DB> db);
  absl::Status Closed() const;  // what every call returns while db_ is null
  const std::string path_;
  // Every call reads db_ under a reader lock; Reopen() replaces it.
  absl::Mutex mu_;
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);  // null: closed
};

}  // namespace strata

#endif  // STRATA_STORAGE_METADATA_STORE_H_
