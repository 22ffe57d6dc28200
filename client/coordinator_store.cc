#include "client/coordinator_store.h"

#include <gloo/common/error.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

void ThrowIfError(const absl::Status& s) {
  if (!s.ok()) throw gloo::IoException(s.ToString());
}

}  // namespace

CoordinatorStore::CoordinatorStore(const std::string& coordinator_address,
                                   const ChannelCredentials& credentials, std::string prefix,
                                   std::function<bool()> abandon, absl::Duration min_wait)
    : stub_(v1::Coordinator::NewStub(MakeChannel(coordinator_address, credentials))),
      prefix_(std::move(prefix)),
      abandon_(std::move(abandon)),
      min_wait_(min_wait) {}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest request;
  request.set_key(prefix_ + key);
  request.set_value(value);
  v1::KvSetResponse response;
  return CallUnary(stub_.get(), &v1::Coordinator::Stub::KvSet, request, &response, kRpcTimeout);
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key) {
  v1::KvGetRequest request;
  request.set_key(prefix_ + key);
  v1::KvGetResponse response;
  RETURN_IF_ERROR(
      CallUnary(stub_.get(), &v1::Coordinator::Stub::KvGet, request, &response, kRpcTimeout));
  return std::move(*response.mutable_value());
}

absl::Status CoordinatorStore::Wait(const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) {
  absl::Time deadline = absl::Now() + std::max(absl::FromChrono(timeout), min_wait_);
  absl::Duration backoff = absl::Milliseconds(1);
  for (const std::string& key : keys) {
    while (true) {
      absl::StatusOr<std::string> value = Get(key);
      if (value.ok()) break;
      // UNAVAILABLE: the coordinator restarts; asked again until the deadline.
      if (!absl::IsNotFound(value.status()) && !absl::IsUnavailable(value.status())) {
        return value.status();
      }
      if (abandon_ && abandon_()) {
        return absl::AbortedError(
            absl::StrCat("rendezvous at '", prefix_, "' abandoned while waiting for '", key, "'"));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous key '", prefix_, key, "' did not appear in time"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(50));
    }
  }
  // A newer generation formed: the peers that wrote these keys may have left
  // this one, and connecting to them would wait out gloo's connect timeout.
  if (abandon_ && abandon_()) {
    return absl::AbortedError(
        absl::StrCat("rendezvous at '", prefix_, "' abandoned with its keys there"));
  }
  return absl::OkStatus();
}

void CoordinatorStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(Set(key, std::string(data.begin(), data.end())));
}

std::vector<char> CoordinatorStore::get(const std::string& key) {
  wait({key});
  absl::StatusOr<std::string> value = Get(key);
  ThrowIfError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void CoordinatorStore::wait(const std::vector<std::string>& keys) { wait(keys, kDefaultTimeout); }

void CoordinatorStore::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  ThrowIfError(Wait(keys, timeout));
}

}  // namespace strata
