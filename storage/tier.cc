#include "storage/tier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/round_up.h"

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

absl::Status BudgetExceeded(absl::string_view tier, uint64_t num_bytes, uint64_t used_bytes,
                            uint64_t budget_bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(tier, ": ", num_bytes,
                                                   " bytes do not fit: ", used_bytes, " of ",
                                                   budget_bytes, " budget bytes in use"));
}

absl::StatusOr<uint64_t> RoundUpInBudget(absl::string_view tier, uint64_t num_bytes,
                                         uint64_t alignment, uint64_t used_bytes,
                                         uint64_t budget_bytes) {
  const uint64_t left = budget_bytes - std::min(used_bytes, budget_bytes);
  if (num_bytes > left) return BudgetExceeded(tier, num_bytes, used_bytes, budget_bytes);
  const uint64_t rounded = RoundUp(num_bytes, alignment);
  if (rounded > left) return BudgetExceeded(tier, num_bytes, used_bytes, budget_bytes);
  return rounded;
}

absl::Status CheckRange(absl::string_view tier, uint64_t extent_id, uint64_t extent_bytes,
                        uint64_t offset, uint64_t num_bytes) {
  if (offset <= extent_bytes && num_bytes <= extent_bytes - offset) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(tier, ": range [", offset, ", ", offset + num_bytes,
                                            ") is outside extent ", extent_id, " of ", extent_bytes,
                                            " bytes"));
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
