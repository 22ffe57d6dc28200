// FreeRanges against a model of the space one unit at a time: best fit,
// merging, TakeAt, and the free and largest-range figures.
#include "storage/free_ranges.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

TEST(FreeRangesTest, TakesTheSmallestRangeThatHoldsARequest) {
  FreeRanges ranges;
  ranges.Give(0, 100);
  ranges.Give(200, 60);
  ranges.Give(400, 80);
  ranges.Give(600, 60);
  EXPECT_EQ(ranges.TakeBestFit(60), std::optional<uint64_t>(200));  // the lower of two equals
  EXPECT_EQ(ranges.TakeBestFit(100), std::optional<uint64_t>(0));   // still whole
  EXPECT_EQ(ranges.TakeBestFit(70), std::optional<uint64_t>(400));
  EXPECT_EQ(ranges.largest_range_bytes(), 60u);
  EXPECT_EQ(ranges.free_bytes(), 70u);  // 400+70..480 and 600..660
  EXPECT_EQ(ranges.TakeBestFit(61), std::nullopt);
  EXPECT_EQ(ranges.TakeBestFit(10), std::optional<uint64_t>(470));
  EXPECT_EQ(ranges.free_bytes(), 60u);
}

TEST(FreeRangesTest, GivenBackRangesMergeWithBothNeighbours) {
  FreeRanges ranges;
  ranges.Give(0, 300);
  ASSERT_EQ(ranges.TakeBestFit(100), std::optional<uint64_t>(0));
  ASSERT_EQ(ranges.TakeBestFit(100), std::optional<uint64_t>(100));
  ASSERT_EQ(ranges.TakeBestFit(100), std::optional<uint64_t>(200));
  ranges.Give(0, 100);
  ranges.Give(200, 100);
  EXPECT_EQ(ranges.largest_range_bytes(), 100u);
  ranges.Give(100, 100);
  EXPECT_EQ(ranges.largest_range_bytes(), 300u);
  EXPECT_EQ(ranges.TakeBestFit(300), std::optional<uint64_t>(0));
  EXPECT_EQ(ranges.free_bytes(), 0u);
}

TEST(FreeRangesTest, TakeAtTakesOnlyWhatIsWhollyFree) {
  FreeRanges ranges;
  ranges.Give(100, 100);
  EXPECT_FALSE(ranges.TakeAt(50, 60));
  EXPECT_FALSE(ranges.TakeAt(150, 60));
  EXPECT_FALSE(ranges.TakeAt(150, UINT64_MAX));  // wraps
  EXPECT_TRUE(ranges.TakeAt(140, 20));
  EXPECT_EQ(ranges.free_bytes(), 80u);
  EXPECT_EQ(ranges.largest_range_bytes(), 40u);
  EXPECT_EQ(ranges.TakeBestFit(40), std::optional<uint64_t>(100));  // the lower of two equals
  EXPECT_EQ(ranges.TakeBestFit(40), std::optional<uint64_t>(160));
}

// The model: one flag per unit of a space of kUnits.
class Model {
 public:
  static constexpr uint64_t kUnits = 512;

  // The maximal free runs as (offset, size), by offset.
  std::vector<std::pair<uint64_t, uint64_t>> Runs() const {
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    for (uint64_t i = 0; i < kUnits;) {
      if (!free_[i]) {
        ++i;
        continue;
      }
      uint64_t end = i;
      while (end < kUnits && free_[end]) ++end;
      runs.emplace_back(i, end - i);
      i = end;
    }
    return runs;
  }
  std::optional<uint64_t> BestFit(uint64_t size) const {
    std::optional<std::pair<uint64_t, uint64_t>> best;  // (size, offset)
    for (const auto& [offset, run] : Runs()) {
      if (run >= size && (!best || run < best->first)) best = {{run, offset}};
    }
    if (!best) return std::nullopt;
    return best->second;
  }
  void Set(uint64_t offset, uint64_t size, bool free) {
    for (uint64_t i = offset; i < offset + size; ++i) free_[i] = free;
  }
  bool AllFree(uint64_t offset, uint64_t size) const {
    if (offset + size > kUnits) return false;
    for (uint64_t i = offset; i < offset + size; ++i) {
      if (!free_[i]) return false;
    }
    return true;
  }
  uint64_t FreeUnits() const {
    uint64_t n = 0;
    for (bool f : free_) n += f;
    return n;
  }
  uint64_t Largest() const {
    uint64_t largest = 0;
    for (const auto& [offset, run] : Runs()) largest = std::max(largest, run);
    return largest;
  }

 private:
  std::vector<bool> free_ = std::vector<bool>(kUnits, false);
};

TEST(FreeRangesTest, AgreesWithAModelOfEveryUnit) {
  std::mt19937 rng(testing::TestSeed());
  FreeRanges ranges;
  Model model;
  ranges.Give(0, Model::kUnits);
  model.Set(0, Model::kUnits, true);
  std::vector<std::pair<uint64_t, uint64_t>> taken;  // (offset, size)
  for (int op = 0; op < 20000; ++op) {
    const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
    if (kind < 5) {
      const uint64_t size = std::uniform_int_distribution<uint64_t>(1, 48)(rng);
      const std::optional<uint64_t> got = ranges.TakeBestFit(size);
      ASSERT_EQ(got, model.BestFit(size)) << "op " << op << " size " << size;
      if (got) {
        model.Set(*got, size, false);
        taken.emplace_back(*got, size);
      }
    } else if (kind < 9 && !taken.empty()) {
      const size_t i = std::uniform_int_distribution<size_t>(0, taken.size() - 1)(rng);
      const auto [offset, size] = taken[i];
      taken[i] = taken.back();
      taken.pop_back();
      ranges.Give(offset, size);
      model.Set(offset, size, true);
    } else {
      const uint64_t offset = std::uniform_int_distribution<uint64_t>(0, Model::kUnits)(rng);
      const uint64_t size = std::uniform_int_distribution<uint64_t>(1, 16)(rng);
      const bool expected = model.AllFree(offset, size);
      ASSERT_EQ(ranges.TakeAt(offset, size), expected) << "op " << op << " at " << offset;
      if (expected) {
        model.Set(offset, size, false);
        taken.emplace_back(offset, size);
      }
    }
    ASSERT_EQ(ranges.free_bytes(), model.FreeUnits()) << "op " << op;
    ASSERT_EQ(ranges.largest_range_bytes(), model.Largest()) << "op " << op;
  }
}

}  // namespace
}  // namespace strata
