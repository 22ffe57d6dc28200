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

absl::Status ReadAndWait(Tier& tier, const Extent& from, uint64_t offset,
                         absl::Span<std::byte> to) {
  absl::Notification done;
  absl::Status result;
  tier.Read(from, offset, to, [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::Status WriteAndWait(Tier& tier, const Extent& to, uint64_t offset,
                          absl::Span<const std::byte> from) {
  absl::Notification done;
  absl::Status result;
  tier.Write(to, offset, from, [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace strata
