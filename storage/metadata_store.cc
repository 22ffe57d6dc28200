#include "storage/metadata_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

}  // namespace

MetadataStore::MetadataStore(std::string path, std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), db_(std::move(db)) {}

MetadataStore::~MetadataStore() {
  if (db_ != nullptr) db_->Close().PermitUncheckedError();
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::OpenInDataDir(
    const std::string& data_dir) {
  if (data_dir.empty()) return absl::InvalidArgumentError("a data directory is required");
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create data directory ", data_dir, ": ", error.message()));
  }
  return Open(absl::StrCat(data_dir, "/metadata"));
}

absl::StatusOr<std::unique_ptr<MetadataStore>> MetadataStore::Open(const std::string& path) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.max_log_file_size = 1 << 20;
  options.keep_log_file_num = 2;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &db);
  if (!s.ok()) return FromRocks(s, "open", path);
  return std::unique_ptr<MetadataStore>(new MetadataStore(path, std::unique_ptr<rocksdb::DB>(db)));
}

absl::Status MetadataStore::Put(absl::string_view key, absl::string_view value, bool sync) {
  rocksdb::WriteOptions options;
  options.sync = sync;
  return FromRocks(db_->Put(options, ToSlice(key), ToSlice(value)), "put", path_);
}

absl::StatusOr<std::optional<std::string>> MetadataStore::Get(absl::string_view key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ToSlice(key), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "get", path_);
  return std::optional<std::string>(std::move(value));
}

absl::Status MetadataStore::Delete(absl::string_view key) {
  return FromRocks(db_->Delete(rocksdb::WriteOptions(), ToSlice(key)), "delete", path_);
}

absl::Status MetadataStore::DeletePrefix(absl::string_view prefix) {
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
