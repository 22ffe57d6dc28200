#include "client/generation_agreement.h"

#include <algorithm>
#include <array>

#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::optional<v1::Generation>> AgreeOnNewestGeneration(
    uint64_t group_generation, uint32_t world_size, absl::Duration hear_wait, absl::Time deadline,
    absl::FunctionRef<v1::Generation()> latest,
    absl::FunctionRef<void(uint64_t number, absl::Time deadline)> wait_to_hear,
    absl::FunctionRef<absl::Status(absl::Span<double> values)> all_reduce_sum) {
  uint64_t wanted = group_generation + 1;  // the generation this worker waits to hear of
  for (int round = 0; round < kAgreeRounds; ++round) {
    if (latest().number() < wanted) {
      wait_to_hear(wanted, std::min(deadline, absl::Now() + hear_wait));
    }
    const v1::Generation heard_last = latest();
    const uint64_t ahead =
        heard_last.number() > group_generation ? heard_last.number() - group_generation : 0;
    std::array<double, kAgreeSlots> heard{};
    heard[std::min(ahead, kAgreeSlots - 1)] = 1.0;
    RETURN_IF_ERROR(all_reduce_sum(absl::MakeSpan(heard)));
    uint64_t newest = kAgreeSlots - 1;
    while (newest > 0 && heard[newest] == 0) --newest;
    if (newest == kAgreeSlots - 1) break;  // too far ahead to tell generations apart
    if (heard[newest] == static_cast<double>(world_size)) return heard_last;
    wanted = group_generation + newest;
  }
  return std::nullopt;
}

}  // namespace strata
