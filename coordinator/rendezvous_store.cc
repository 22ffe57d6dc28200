#include "coordinator/rendezvous_store.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/rendezvous_keys.h"

namespace strata {
namespace {

constexpr char kKvPrefix[] = "kv/";

}  // namespace

absl::Status RendezvousStore::Set(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key must have 1 to ", kMaxKeyBytes, " bytes"));
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of ", value.size(), " bytes exceeds the maximum of ", kMaxValueBytes));
  }
  return metadata_->Put(absl::StrCat(kKvPrefix, key), value);
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& key) {
  ASSIGN_OR_RETURN(std::optional<std::string> value, metadata_->Get(absl::StrCat(kKvPrefix, key)));
  if (!value.has_value()) return absl::NotFoundError(absl::StrCat("no key ", Quoted(key)));
  return *std::move(value);
}

absl::Status RendezvousStore::DeleteJob(const std::string& job_id) {
  return metadata_->DeletePrefix(absl::StrCat(kKvPrefix, RendezvousPrefix(job_id)));
}

}  // namespace strata
