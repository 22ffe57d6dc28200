#include "shard/storage_probe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/log.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr char kProbeFile[] = ".storage-probe";
constexpr char kProbeKey[] = "storage-probe";
constexpr size_t kProbeBytes = 4096;

absl::Status ErrnoError(const std::string& path, const char* what) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Writes kProbeBytes to `directory`/kProbeFile and syncs them.
absl::Status WriteProbeFile(const std::string& directory) {
  const std::string path = absl::StrCat(directory, "/", kProbeFile);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(path, "open");
  static const char kZeros[kProbeBytes] = {};
  absl::Status s;
  if (pwrite(fd, kZeros, kProbeBytes, 0) != static_cast<ssize_t>(kProbeBytes)) {
    s = ErrnoError(path, "write");
  } else if (fdatasync(fd) != 0) {
    s = ErrnoError(path, "sync");
  }
  close(fd);
  return s;
}

}  // namespace

StorageProbe::StorageProbe(absl::Duration interval, std::vector<std::string> directories,
                           MetadataStore* metadata, std::function<void(bool)> on_change)
    : interval_(interval),
      directories_(std::move(directories)),
      metadata_(metadata),
      on_change_(std::move(on_change)),
      thread_([this] { Loop(); }) {}

StorageProbe::~StorageProbe() { Stop(); }

void StorageProbe::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool StorageProbe::healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

absl::Status StorageProbe::Probe() {
  RETURN_IF_ERROR(
      metadata_->Put(kProbeKey, absl::StrCat(absl::ToUnixMillis(absl::Now())), /*sync=*/true));
  for (const std::string& directory : directories_) RETURN_IF_ERROR(WriteProbeFile(directory));
  return absl::OkStatus();
}

void StorageProbe::Loop() {
  absl::Time failed_at;
  std::string failure;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), interval_)) return;
    }
    const bool was_healthy = healthy();
    // RocksDB refuses every write after a failed one until reopened.
    if (!was_healthy) metadata_->Reopen().IgnoreError();
    absl::Status probed = Probe();
    if (probed.ok() == was_healthy) continue;
    if (!probed.ok()) {
      failed_at = absl::Now();
      failure = probed.ToString();
      LogEventCat("server", "storage failed (", failure, "): NOT_SERVING until it takes writes");
    } else {
      LogEventCat("server", "storage takes writes again after ",
                  absl::FormatDuration(absl::Now() - failed_at), " (it had failed: ", failure,
                  "): SERVING");
    }
    {
      absl::MutexLock lock(&mu_);
      healthy_ = probed.ok();
    }
    on_change_(probed.ok());
  }
}

}  // namespace strata
