// ParallelFor: every item once, on the threads it names; after an error the
// rest are skipped (not run) and the first error is returned.
#include "core/parallel_for.h"

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ParallelForTest, RunsEveryItemOnceOnTheThreadsItNames) {
  for (size_t threads : {1, 2, 5}) {
    for (size_t n : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> runs(n);
      std::atomic<bool> bad_thread{false};
      absl::Status s = ParallelFor(n, threads, [&](size_t thread, size_t i) {
        if (thread >= threads) bad_thread = true;
        runs[i]++;
        return absl::OkStatus();
      });
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_FALSE(bad_thread) << threads << " threads";
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i], 1) << "item " << i << " of " << n;
    }
  }
}

TEST(ParallelForTest, AfterAnErrorTheRestAreSkippedAndTheFirstErrorReturned) {
  constexpr size_t kN = 200;
  for (size_t threads : {1, 3}) {
    std::vector<std::atomic<int>> runs(kN), skips(kN);
    absl::Status s = ParallelFor(
        kN, threads,
        [&](size_t, size_t i) {
          runs[i]++;
          return i >= 10 ? absl::DataLossError(absl::StrCat("item ", i)) : absl::OkStatus();
        },
        [&](size_t i) { skips[i]++; });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    size_t skipped = 0;
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_EQ(runs[i] + skips[i], 1) << "item " << i;
      skipped += skips[i];
      if (i <= 10) EXPECT_EQ(runs[i], 1) << "item " << i << " starts before any error";
    }
    // Items start in order: when the first error is seen, items 0-9 have
    // ended and at most one per thread is running; all later ones are skipped.
    EXPECT_GE(skipped, kN - 10 - threads) << threads << " threads";
    if (threads == 1) EXPECT_EQ(s.message(), "item 10");
  }
}

}  // namespace
}  // namespace strata
