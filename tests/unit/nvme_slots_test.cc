// NvmeSlots (shard/nvme_slots.h) over a tier with a budget: states are
// refused while the tier would keep too little room for the commits' new
// slots (as large as the largest state's); commits take that room, at most
// `spares` at once, and give a slot back as they end.
#include "shard/nvme_slots.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/host_tier.h"

namespace strata {
namespace {

constexpr uint64_t kSlot = 4096;

TEST(NvmeSlotsTest, StatesLeaveRoomForTheSparesOfTheLargestState) {
  HostTier tier(10 * kSlot);
  NvmeSlots slots(&tier, /*spares=*/2);
  // Three states of one unit and two spares' room: 5 units.
  std::vector<Extent> states;
  for (int i = 0; i < 3; ++i) {
    auto slot = slots.Allocate(kSlot);
    ASSERT_TRUE(slot.ok()) << slot.status();
    states.push_back(*slot);
  }
  // A state of three units would need 3 + 2 x 3 of the 7 left.
  auto large = slots.Allocate(3 * kSlot);
  EXPECT_EQ(large.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(large.status().message().find("room for 2 commits"), absl::string_view::npos)
      << large.status();
  EXPECT_EQ(tier.used_bytes(), 3 * kSlot);
  // One of two units fits (3 + 2 + 2 x 2 = 9), and a unit more (10); then
  // another would leave less than the two spares of two units.
  auto two = slots.Allocate(2 * kSlot);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(slots.Allocate(kSlot).ok());
  EXPECT_EQ(slots.Allocate(kSlot).status().code(), absl::StatusCode::kResourceExhausted);
  // Freed, the two-unit state no longer sets the spares' size: 4 + 1 + 2 fit.
  slots.Free(*two);
  EXPECT_TRUE(slots.Allocate(kSlot).ok());
  EXPECT_EQ(tier.used_bytes(), 5 * kSlot);
}

TEST(NvmeSlotsTest, CommitsTakeTheSparesRoomAtMostSparesAtOnce) {
  HostTier tier(6 * kSlot);
  NvmeSlots slots(&tier, /*spares=*/2);
  std::vector<Extent> states;
  for (int i = 0; i < 4; ++i) states.push_back(*slots.Allocate(kSlot));
  EXPECT_FALSE(slots.Allocate(kSlot).ok());
  // Two commits' new slots fill the tier; a state's refusal counts the
  // states' bytes without them.
  auto first = slots.BeginCommit(kSlot);
  auto second = slots.BeginCommit(kSlot);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(tier.used_bytes(), 6 * kSlot);
  EXPECT_NE(slots.Allocate(kSlot).status().message().find("16384 bytes of states"),
            absl::string_view::npos);
  // A third commit waits until one ends.
  std::atomic<bool> began{false};
  std::thread third([&] {
    auto slot = slots.BeginCommit(kSlot);
    EXPECT_TRUE(slot.ok()) << slot.status();
    began = true;
    slots.EndCommit(*slot);
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(began.load());
  // The first commit succeeded: its state's old slot goes back.
  slots.EndCommit(states[0]);
  states[0] = *first;
  third.join();
  EXPECT_TRUE(began.load());
  // The second failed: its new slot goes back.
  slots.EndCommit(*second);
  EXPECT_EQ(tier.used_bytes(), 4 * kSlot);
  for (const Extent& s : states) slots.Free(s);
  EXPECT_EQ(tier.used_bytes(), 0u);
}

}  // namespace
}  // namespace strata
