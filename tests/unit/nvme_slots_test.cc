// NvmeSlots (shard/nvme_slots.h) over an NVMe tier: each slot size in use
// keeps its spares beside its states, taken with them; commits swap a
// state's slot with a spare of its size and never allocate, so a tier
// filled with states of many sizes (its free space cut into pieces) still
// finds every commit its slot.
#include "shard/nvme_slots.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/nvme_tier.h"
#include "testing/scratch_dir.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

constexpr uint64_t kUnit = NvmeTier::kBlockBytes;

class NvmeSlotsTest : public ::testing::Test {
 protected:
  void Open(uint64_t units) {
    auto nvme = NvmeTier::Open(NvmeTierOptions{scratch_.path(), units * kUnit, 8});
    ASSERT_TRUE(nvme.ok()) << nvme.status();
    nvme_ = *std::move(nvme);
  }
  uint64_t UsedUnits() const { return nvme_->used_bytes() / kUnit; }
  // A state's slot as a restart takes it back: in the tier, then counted.
  Extent Adopt(NvmeSlots* slots, uint64_t units) {
    absl::StatusOr<Extent> slot = nvme_->Allocate(units * kUnit);
    if (!slot.ok()) {
      ADD_FAILURE() << slot.status();
      return {};
    }
    slots->Adopted(*slot);
    return *slot;
  }
  // Commits `state`, then frees it: `used_units` after the commit, none
  // after the free.
  void CommitThenFree(NvmeSlots* slots, const Extent& state, uint64_t used_units) {
    absl::StatusOr<Extent> next = slots->BeginCommit(state.num_bytes);
    ASSERT_TRUE(next.ok()) << next.status();
    slots->EndCommit(state);
    EXPECT_EQ(UsedUnits(), used_units);
    slots->Free(*next);
    EXPECT_EQ(UsedUnits(), 0u);
  }

  const testing::ScratchDir scratch_{"nvme_slots_test"};
  std::unique_ptr<NvmeTier> nvme_;
};

TEST_F(NvmeSlotsTest, EachSlotSizeKeepsItsSparesBesideItsStates) {
  ASSERT_NO_FATAL_FAILURE(Open(12));
  NvmeSlots slots(nvme_.get(), /*spares=*/2);
  // Three states of one unit, and two spares of one unit: 5 units.
  std::vector<Extent> states;
  for (int i = 0; i < 3; ++i) {
    auto slot = slots.Allocate(kUnit);
    ASSERT_TRUE(slot.ok()) << slot.status();
    states.push_back(*slot);
  }
  EXPECT_EQ(UsedUnits(), 5u);
  // A state of four units needs a spare of four (one state: one spare), 8
  // of the 7 units left: refused, nothing taken.
  auto large = slots.Allocate(4 * kUnit);
  EXPECT_EQ(large.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(large.status().message().find("spare"), absl::string_view::npos) << large.status();
  EXPECT_EQ(UsedUnits(), 5u);
  // One of two units with its spare fits (9), then a third of one unit with
  // no new spare (10), a fourth (11) and a fifth (12); then none.
  auto two = slots.Allocate(2 * kUnit);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(UsedUnits(), 9u);
  for (int i = 0; i < 3; ++i) {
    auto slot = slots.Allocate(kUnit);
    ASSERT_TRUE(slot.ok()) << slot.status();
    states.push_back(*slot);
  }
  EXPECT_EQ(UsedUnits(), 12u);
  EXPECT_EQ(slots.Allocate(kUnit).status().code(), absl::StatusCode::kResourceExhausted);
  // Freed, the two-unit state takes its spare along.
  slots.Free(*two);
  EXPECT_EQ(UsedUnits(), 8u);
  for (const Extent& s : states) slots.Free(s);
  EXPECT_EQ(UsedUnits(), 0u);
}

TEST_F(NvmeSlotsTest, ACommitSwapsItsSlotWithASpareOfItsSize) {
  ASSERT_NO_FATAL_FAILURE(Open(6));
  NvmeSlots slots(nvme_.get(), /*spares=*/2);
  std::vector<Extent> states;
  for (int i = 0; i < 4; ++i) states.push_back(*slots.Allocate(kUnit));
  EXPECT_EQ(UsedUnits(), 6u);  // four states, two spares: the tier is full
  // Two commits take the spares; the tier's bytes do not change.
  auto first = slots.BeginCommit(kUnit);
  auto second = slots.BeginCommit(kUnit);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << " " << second.status();
  EXPECT_EQ(UsedUnits(), 6u);
  // A third commit waits until one ends.
  std::atomic<bool> began{false};
  std::thread third([&] {
    auto slot = slots.BeginCommit(kUnit);
    EXPECT_TRUE(slot.ok()) << slot.status();
    began = true;
    slots.EndCommit(*slot);
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(began.load());
  // The first commit succeeded: its state's old slot is the spare now.
  slots.EndCommit(states[0]);
  states[0] = *first;
  third.join();
  EXPECT_TRUE(began.load());
  // The second failed: its new slot is a spare again.
  slots.EndCommit(*second);
  EXPECT_EQ(UsedUnits(), 6u);
  for (const Extent& s : states) slots.Free(s);
  EXPECT_EQ(UsedUnits(), 0u);
}

// After a restart the states come back where their records say, before
// any spare: adopting takes nothing more, and a state's first commit makes
// the spare of its size.
TEST_F(NvmeSlotsTest, AnAdoptedStatesSpareIsMadeAtItsFirstCommit) {
  ASSERT_NO_FATAL_FAILURE(Open(4));
  NvmeSlots slots(nvme_.get(), /*spares=*/2);
  const Extent adopted = Adopt(&slots, 2);
  EXPECT_EQ(UsedUnits(), 2u);
  CommitThenFree(&slots, adopted, 4);
}

// A new state comes after the spares of the adopted ones: the room their
// commits need is not given away.
TEST_F(NvmeSlotsTest, ANewStateIsPlacedOnlyBesideTheAdoptedStatesSpares) {
  ASSERT_NO_FATAL_FAILURE(Open(5));
  NvmeSlots slots(nvme_.get(), /*spares=*/2);
  const Extent adopted = Adopt(&slots, 2);
  // One unit and its spare beside the adopted state's spare: 6 of 5.
  EXPECT_EQ(slots.Allocate(kUnit).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(UsedUnits(), 4u);  // the adopted state and its spare
  CommitThenFree(&slots, adopted, 4);
}

TEST_F(NvmeSlotsTest, AnAdoptedStateWithNoRoomForItsSpareCannotCommit) {
  ASSERT_NO_FATAL_FAILURE(Open(3));
  NvmeSlots slots(nvme_.get(), /*spares=*/2);
  const Extent adopted = Adopt(&slots, 2);
  auto refused = slots.BeginCommit(2 * kUnit);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("spare"), absl::string_view::npos) << refused.status();
  EXPECT_EQ(UsedUnits(), 2u);
  slots.Free(adopted);
  EXPECT_EQ(UsedUnits(), 0u);
}

// As a server runs them: jobs of several chunk sizes, each job's last chunk
// shorter, fill the tier until a state is refused; then commits of random
// states, one at a time per state and at most `spares` at once, end in
// random order, each a success (the old slot given back) or a failed write
// (the new one). Allocating each commit's slot from the tier's free space
// failed here within a few dozen commits: freed slots of one size were cut
// by another's.
TEST_F(NvmeSlotsTest, CommitsOfStatesOfManySizesAlwaysFindTheirSlot) {
  const uint32_t seed = testing::TestSeed();
  std::mt19937 random(seed);
  auto uniform = [&](uint64_t low, uint64_t high) {
    return std::uniform_int_distribution<uint64_t>(low, high)(random);
  };
  ASSERT_NO_FATAL_FAILURE(Open(4096));
  constexpr int kSpares = 3;
  NvmeSlots slots(nvme_.get(), kSpares);
  std::vector<Extent> states;
  for (bool full = false; !full;) {
    const uint64_t chunk_units = 16 * uniform(1, 6);
    const uint64_t chunks = uniform(2, 12);
    for (uint64_t c = 0; c < chunks && !full; ++c) {
      const uint64_t units = c + 1 < chunks ? chunk_units : uniform(1, chunk_units);
      absl::StatusOr<Extent> slot = slots.Allocate(units * kUnit);
      full = !slot.ok();
      if (slot.ok()) states.push_back(*slot);
    }
  }
  const uint64_t used = nvme_->used_bytes();
  std::printf("%zu states in %llu of %llu bytes\n", states.size(),
              static_cast<unsigned long long>(used),
              static_cast<unsigned long long>(nvme_->budget_bytes()));
  ASSERT_GT(states.size(), 10u);

  std::map<size_t, Extent> in_flight;  // state -> its commit's new slot
  for (int round = 0; round < 5000; ++round) {
    const size_t state = uniform(0, states.size() - 1);
    if (in_flight.size() < kSpares && in_flight.count(state) == 0 && uniform(0, 1) == 0) {
      absl::StatusOr<Extent> next = slots.BeginCommit(states[state].num_bytes);
      ASSERT_TRUE(next.ok()) << "round " << round << ": " << next.status() << " (seed " << seed
                             << ")";
      in_flight[state] = *next;
    } else if (!in_flight.empty()) {
      auto it = std::next(in_flight.begin(), uniform(0, in_flight.size() - 1));
      if (uniform(0, 3) > 0) {
        slots.EndCommit(states[it->first]);
        states[it->first] = it->second;
      } else {
        slots.EndCommit(it->second);
      }
      in_flight.erase(it);
    }
  }
  for (const auto& [state, next] : in_flight) slots.EndCommit(next);
  EXPECT_EQ(nvme_->used_bytes(), used) << "seed " << seed;
  for (const Extent& s : states) slots.Free(s);
  EXPECT_EQ(nvme_->used_bytes(), 0u);
}

}  // namespace
}  // namespace strata
