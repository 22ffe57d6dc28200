#include "storage/tier.h"

#include "absl/synchronization/notification.h"

namespace strata {

const char* TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kGpu:
      return "gpu";
    case TierKind::kHost:
      return "host";
    case TierKind::kNvme:
      return "nvme";
  }
  return "unknown";
}

namespace {

// Runs start(done) and waits for `done`; returns the status it got.
template <typename Start>
absl::Status StartAndWait(Start start) {
  absl::Notification done;
  absl::Status result;
  start([&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace

absl::Status ReadAndWait(Tier& tier, const Extent& from, uint64_t offset,
                         absl::Span<std::byte> to) {
  return StartAndWait([&](IoDone done) { tier.Read(from, offset, to, std::move(done)); });
}

absl::Status WriteAndWait(Tier& tier, const Extent& to, uint64_t offset,
                          absl::Span<const std::byte> from) {
  return StartAndWait([&](IoDone done) { tier.Write(to, offset, from, std::move(done)); });
}

}  // namespace strata
