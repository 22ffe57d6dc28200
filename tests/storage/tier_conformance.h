// The conformance suite every Tier passes. Instantiate it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Host, TierConformanceTest,
//       ::testing::Values(TierFactory{"host", [](uint64_t budget, const std::string&) {
//         ... }}));
//
// A factory returns a tier of the given budget, or nullptr to skip (a GPU
// tier on a machine without a GPU); a tier that keeps files keeps them in the
// directory it is given (which does not exist yet, and is removed after the
// test). Buffers are 4 KiB aligned and sizes whole 4 KiB blocks, the
// strictest alignment any tier asks for.
#ifndef STRATA_TESTS_STORAGE_TIER_CONFORMANCE_H_
#define STRATA_TESTS_STORAGE_TIER_CONFORMANCE_H_

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "storage/tier.h"
#include "testing/scratch_dir.h"

namespace strata::testing {

struct TierFactory {
  std::string name;
  std::function<std::unique_ptr<Tier>(uint64_t budget_bytes, const std::string& dir)> make;
};

inline constexpr uint64_t kBlock = 4096;

// A 4 KiB-aligned buffer.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t num_bytes)
      : size_(num_bytes),
        data_(static_cast<std::byte*>(std::aligned_alloc(kBlock, std::max(num_bytes, kBlock)))) {}
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  absl::Span<std::byte> span() { return absl::MakeSpan(data_, size_); }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < size_; ++i) data_[i] = static_cast<std::byte>(rng());
  }
  bool operator==(const AlignedBuffer& other) const {
    return size_ == other.size_ && std::memcmp(data_, other.data_, size_) == 0;
  }

 private:
  size_t size_;
  std::byte* data_;
};

class TierConformanceTest : public ::testing::TestWithParam<TierFactory> {
 protected:
  // The tier, or nullptr after marking the test skipped.
  std::unique_ptr<Tier> Make(uint64_t budget) {
    std::unique_ptr<Tier> tier =
        GetParam().make(budget, scratch_.path() + "/tier" + std::to_string(made_++));
    if (tier == nullptr) Skip();
    return tier;
  }

 private:
  void Skip() { GTEST_SKIP() << GetParam().name << " tier not available here"; }

  const ScratchDir scratch_{"tier_test_" + GetParam().name};
  int made_ = 0;
};

TEST_P(TierConformanceTest, KeepsWithinItsBudget) {
  auto tier = Make(16 * kBlock);
  if (tier == nullptr) return;
  EXPECT_EQ(tier->budget_bytes(), 16 * kBlock);
  auto a = tier->Allocate(10 * kBlock);
  ASSERT_TRUE(a.ok()) << a.status();
  uint64_t used = tier->used_bytes();
  EXPECT_GE(used, 10 * kBlock);
  auto b = tier->Allocate(7 * kBlock);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_EQ(tier->used_bytes(), used);
  tier->Free(*a);
  EXPECT_EQ(tier->used_bytes(), 0u);
  auto whole = tier->Allocate(16 * kBlock);
  EXPECT_TRUE(whole.ok()) << whole.status();
}

// Sizes whose rounding up to the tier's alignment wraps past 2^64 once
// took no budget and handed out an extent of that size.
TEST_P(TierConformanceTest, RefusesSizesThatWrapWhenRounded) {
  auto tier = Make(16 * kBlock);
  if (tier == nullptr) return;
  for (uint64_t huge : {~uint64_t{0}, ~uint64_t{0} - kBlock + 2, uint64_t{1} << 63}) {
    auto e = tier->Allocate(huge);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << huge;
  }
  EXPECT_EQ(tier->used_bytes(), 0u);
  EXPECT_TRUE(tier->Allocate(16 * kBlock).ok());
}

TEST_P(TierConformanceTest, WritesAndReadsBackExtentsAndBlocks) {
  auto tier = Make(64 * kBlock);
  if (tier == nullptr) return;
  auto a = tier->Allocate(8 * kBlock);
  auto b = tier->Allocate(4 * kBlock);
  ASSERT_TRUE(a.ok() && b.ok());
  AlignedBuffer in_a(8 * kBlock), in_b(4 * kBlock), out_a(8 * kBlock), out_b(4 * kBlock);
  in_a.Fill(1);
  in_b.Fill(2);
  ASSERT_TRUE(WriteAndWait(*tier, *a, 0, in_a.span()).ok());
  ASSERT_TRUE(WriteAndWait(*tier, *b, 0, in_b.span()).ok());
  ASSERT_TRUE(ReadAndWait(*tier, *a, 0, out_a.span()).ok());
  ASSERT_TRUE(ReadAndWait(*tier, *b, 0, out_b.span()).ok());
  EXPECT_TRUE(in_a == out_a);
  EXPECT_TRUE(in_b == out_b);
  // One block in the middle, rewritten and read alone.
  AlignedBuffer block(kBlock), back(kBlock);
  block.Fill(3);
  ASSERT_TRUE(WriteAndWait(*tier, *a, 3 * kBlock, block.span()).ok());
  ASSERT_TRUE(ReadAndWait(*tier, *a, 3 * kBlock, back.span()).ok());
  EXPECT_TRUE(block == back);
  ASSERT_TRUE(ReadAndWait(*tier, *b, 0, out_b.span()).ok());
  EXPECT_TRUE(in_b == out_b);  // the neighbour is untouched
}

// An extent to fill reads as a new one, holds what is written, takes its
// bytes of the budget, and keeps its bytes when settled (once or twice).
TEST_P(TierConformanceTest, AnExtentToFillHoldsWhatIsWrittenAndSettles) {
  auto tier = Make(16 * kBlock);
  if (tier == nullptr) return;
  auto e = tier->AllocateToFill(8 * kBlock);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_GE(tier->used_bytes(), 8 * kBlock);
  EXPECT_EQ(tier->AllocateToFill(9 * kBlock).status().code(), absl::StatusCode::kResourceExhausted);
  AlignedBuffer in(8 * kBlock), out(8 * kBlock);
  in.Fill(4);
  ASSERT_TRUE(WriteAndWait(*tier, *e, 0, in.span()).ok());
  ASSERT_TRUE(tier->Settle(*e).ok());
  ASSERT_TRUE(tier->Settle(*e).ok());
  ASSERT_TRUE(ReadAndWait(*tier, *e, 0, out.span()).ok());
  EXPECT_TRUE(in == out);
  tier->Free(*e);
  EXPECT_EQ(tier->used_bytes(), 0u);
}

TEST_P(TierConformanceTest, RefusesRangesOutsideTheExtent) {
  auto tier = Make(16 * kBlock);
  if (tier == nullptr) return;
  auto a = tier->Allocate(2 * kBlock);
  ASSERT_TRUE(a.ok());
  AlignedBuffer buffer(2 * kBlock);
  EXPECT_EQ(ReadAndWait(*tier, *a, 2 * kBlock, buffer.span()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(WriteAndWait(*tier, *a, kBlock, buffer.span()).code(), absl::StatusCode::kOutOfRange);
}

TEST_P(TierConformanceTest, ConcurrentUseFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 20;
  auto tier = Make(kThreads * 4 * kBlock);
  if (tier == nullptr) return;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        auto e = tier->Allocate(4 * kBlock);
        ASSERT_TRUE(e.ok()) << e.status();
        AlignedBuffer in(4 * kBlock), out(4 * kBlock);
        in.Fill(t * 1000 + r);
        ASSERT_TRUE(WriteAndWait(*tier, *e, 0, in.span()).ok());
        ASSERT_TRUE(ReadAndWait(*tier, *e, 0, out.span()).ok());
        ASSERT_TRUE(in == out);
        tier->Free(*e);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(tier->used_bytes(), 0u);
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_STORAGE_TIER_CONFORMANCE_H_
