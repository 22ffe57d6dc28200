// RetryBackoff (coordinator/retry_backoff.h): a failing key is due again
// after 1, 2, 4, ... times the first delay, up to the most; a failure is
// news once until it changes; Forget() starts a key over; keys are apart.
#include "coordinator/retry_backoff.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr absl::Duration kFirst = absl::Seconds(1);
constexpr absl::Duration kMost = absl::Seconds(5);
const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(RetryBackoffTest, AKeyWithoutFailuresIsDue) {
  RetryBackoff backoff(kFirst, kMost);
  EXPECT_TRUE(backoff.Due("job", kStart));
  EXPECT_EQ(backoff.Delay("job"), absl::ZeroDuration());
  EXPECT_TRUE(backoff.empty());
}

TEST(RetryBackoffTest, EachFailureDoublesTheDelayUpToTheMost) {
  RetryBackoff backoff(kFirst, kMost);
  absl::Time now = kStart;
  for (absl::Duration want :
       {absl::Seconds(1), absl::Seconds(2), absl::Seconds(4), absl::Seconds(5), absl::Seconds(5)}) {
    backoff.Failed("job", "unavailable", now);
    EXPECT_EQ(backoff.Delay("job"), want);
    EXPECT_FALSE(backoff.Due("job", now + want - absl::Milliseconds(1))) << want;
    now += want;
    EXPECT_TRUE(backoff.Due("job", now)) << want;
  }
  EXPECT_FALSE(backoff.empty());
}

TEST(RetryBackoffTest, AFailureIsNewsOnlyWhenItChanges) {
  RetryBackoff backoff(kFirst, kMost);
  EXPECT_TRUE(backoff.Failed("job", "no room", kStart));
  EXPECT_FALSE(backoff.Failed("job", "no room", kStart + absl::Seconds(1)));
  EXPECT_TRUE(backoff.Failed("job", "unreachable", kStart + absl::Seconds(3)));
  EXPECT_FALSE(backoff.Failed("job", "unreachable", kStart + absl::Seconds(7)));
  // A changed failure keeps the backoff going: 1, 2, 4, then the most.
  EXPECT_EQ(backoff.Delay("job"), kMost);
}

TEST(RetryBackoffTest, ForgetStartsAKeyOver) {
  RetryBackoff backoff(kFirst, kMost);
  backoff.Failed("job", "no room", kStart);
  backoff.Failed("job", "no room", kStart + absl::Seconds(1));
  backoff.Forget("job");
  EXPECT_TRUE(backoff.Due("job", kStart + absl::Seconds(1)));
  EXPECT_TRUE(backoff.empty());
  EXPECT_TRUE(backoff.Failed("job", "no room", kStart + absl::Seconds(2)));
  EXPECT_EQ(backoff.Delay("job"), kFirst);
}

TEST(RetryBackoffTest, ForgetAllButKeepsOnlyTheKeysNamed) {
  RetryBackoff backoff(kFirst, kMost);
  for (const char* key : {"a", "b", "c"}) backoff.Failed(key, "no room", kStart);
  backoff.ForgetAllBut({"b", "d"});
  EXPECT_TRUE(backoff.Due("a", kStart));
  EXPECT_FALSE(backoff.Due("b", kStart));
  EXPECT_TRUE(backoff.Due("c", kStart));
  EXPECT_TRUE(backoff.Due("d", kStart));
  backoff.ForgetAllBut({});
  EXPECT_TRUE(backoff.empty());
}

TEST(RetryBackoffTest, KeysBackOffApart) {
  RetryBackoff backoff(kFirst, kMost);
  backoff.Failed("a", "no room", kStart);
  backoff.Failed("a", "no room", kStart + absl::Seconds(1));
  backoff.Failed("b", "no room", kStart + absl::Seconds(1));
  EXPECT_EQ(backoff.Delay("a"), absl::Seconds(2));
  EXPECT_EQ(backoff.Delay("b"), kFirst);
  EXPECT_TRUE(backoff.Due("b", kStart + absl::Seconds(2)));
  EXPECT_FALSE(backoff.Due("a", kStart + absl::Seconds(2)));
  EXPECT_TRUE(backoff.Due("c", kStart));
}

}  // namespace
}  // namespace strata
