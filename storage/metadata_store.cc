#include "storage/metadata_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstdarg>
#include <cstdio>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/log.h"
#include "core/status_macros.h"

namespace strata {
namespace {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what, absl::string_view path) {
  if (s.ok()) return absl::OkStatus();
  std::string message = absl::StrCat("metadata store ", path, ": ", what, ": ", s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(message);
  if (s.IsIOError() && absl::StrContains(s.ToString(), "lock")) {
    return absl::FailedPreconditionError(
        absl::StrCat(message, " (is another process using this directory?)"));
  }
  return absl::InternalError(message);
}

rocksdb::Slice ToSlice(absl::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

// RocksDB's warnings and errors, in the daemon's log rather than a LOG file
// beside the database: a file that a full disk would fail (and RocksDB
// asserts on an info-log write after a failed one).
class DaemonLogger : public rocksdb::Logger {
 public:
  DaemonLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    LogEvent("rocksdb", absl::StripTrailingAsciiWhitespace(line));
  }
};

// Opens (creating if missing) the RocksDB database in directory `path`.
absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenDb(const std::string& path) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.info_log = std::make_shared<DaemonLogger>();
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) return FromRocks(s, "open", path);
  return std::unique_ptr<rocksdb::DB>(db);
}

}  // namespace

MetadataStore::MetadataStore(std::string path, std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), db_(std::move(db)) {}

MetadataStore::~MetadataStore() {
  absl::MutexLock lock(&mu_);
  if (db_ != nullptr) db_->Close().PermitUncheckedError();
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::OpenInDataDir(
    const std::string& data_dir) {
  if (data_dir.empty()) return absl::InvalidArgumentError("a data directory is required");
  const std::string path = absl::StrCat(data_dir, "/metadata");
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data directory ", data_dir, ": ", error.message()));
  }
  return Open(path);
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<rocksdb::DB> db, OpenDb(path));
  return std::unique_ptr<MetadataStore>(new MetadataStore(path, std::move(db)));
}

absl::Status MetadataStore::Reopen() {
  absl::MutexLock lock(&mu_);
  if (db_ != nullptr) db_->Close().PermitUncheckedError();
  db_.reset();
  ASSIGN_OR_RETURN(db_, OpenDb(path_));
  return absl::OkStatus();
}

absl::Status MetadataStore::Closed() const {
  return absl::UnavailableError(
      absl::StrCat("metadata store ", path_, ": closed after a failure, until it reopens"));
}

absl::Status MetadataStore::Put(absl::string_view key, absl::string_view value, bool sync) {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return Closed();
  rocksdb::WriteOptions options;
  options.sync = sync;
  return FromRocks(db_->Put(options, ToSlice(key), ToSlice(value)), "put", path_);
}

absl::StatusOr<std::optional<std::string>> MetadataStore::Get(absl::string_view key) {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return Closed();
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ToSlice(key), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "get", path_);
  return std::optional<std::string>(std::move(value));
}

absl::Status MetadataStore::Delete(absl::string_view key) {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return Closed();
  return FromRocks(db_->Delete(rocksdb::WriteOptions(), ToSlice(key)), "delete", path_);
}

absl::Status MetadataStore::DeletePrefix(absl::string_view prefix) {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return Closed();
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(ToSlice(prefix)); it->Valid() && it->key().starts_with(ToSlice(prefix));
       it->Next()) {
    batch.Delete(it->key());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan", path_);
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "delete", path_);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MetadataStore::Scan(
    absl::string_view prefix) {
  absl::ReaderMutexLock lock(&mu_);
  if (db_ == nullptr) return Closed();
  std::vector<std::pair<std::string, std::string>> rows;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(ToSlice(prefix)); it->Valid() && it->key().starts_with(ToSlice(prefix));
       it->Next()) {
    rows.emplace_back(it->key().ToString(), it->value().ToString());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan", path_);
  return rows;
}

}  // namespace strata
