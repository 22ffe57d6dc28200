// StorageProbe: whether a shard server's storage takes writes. Every
// `interval` a background thread writes a synced record to the metadata
// store and a synced small file in each of `directories`. The first round
// that fails calls on_change(false) (the server then answers NOT_SERVING,
// and the coordinator moves its jobs once its server timeout passes); while
// failed, each round first reopens the metadata store, which clears
// RocksDB's sticky error once the storage takes writes again (a full disk
// freed), and the first round that succeeds calls on_change(true).
//
// Thread-safe. on_change runs on the probe's thread, never after Stop()
// (also run by the destructor) returns.
#ifndef STRATA_SHARD_STORAGE_PROBE_H_
#define STRATA_SHARD_STORAGE_PROBE_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/metadata_store.h"

namespace strata {

class StorageProbe {
 public:
  StorageProbe(absl::Duration interval, std::vector<std::string> directories,
               MetadataStore* metadata, std::function<void(bool healthy)> on_change);
  ~StorageProbe();  // Stop()s
  StorageProbe(const StorageProbe&) = delete;
  StorageProbe& operator=(const StorageProbe&) = delete;

  void Stop();
  bool healthy() const;

 private:
  // One round: OK when every directory and the metadata store took a write.
  absl::Status Probe();
  void Loop();

  const absl::Duration interval_;
  const std::vector<std::string> directories_;
  MetadataStore* const metadata_;
  const std::function<void(bool)> on_change_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool healthy_ ABSL_GUARDED_BY(mu_) = true;
  std::thread thread_;  // last: starts once the rest is set
};

}  // namespace strata

#endif  // STRATA_SHARD_STORAGE_PROBE_H_
