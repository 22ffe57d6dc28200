// AnswersInFlight: an answer's owner keeps its memory's owner alive and
// counts until released, on any thread, even after the AnswersInFlight that
// made it is otherwise gone; AwaitNone waits for the last one or a deadline.
#include "shard/answers_in_flight.h"

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(AnswersInFlightTest, AnOwnerKeepsItsMemoryAndCountsUntilReleased) {
  auto answers = std::make_shared<AnswersInFlight>();
  auto memory = std::make_shared<int>(7);
  std::weak_ptr<int> watched = memory;
  std::shared_ptr<const void> first = answers->Hold(memory);
  std::shared_ptr<const void> second = answers->Hold(memory);
  memory.reset();
  EXPECT_EQ(answers->held(), 2);
  first.reset();
  EXPECT_EQ(answers->held(), 1);
  EXPECT_FALSE(watched.expired());
  second.reset();
  EXPECT_EQ(answers->held(), 0);
  EXPECT_TRUE(watched.expired());
}

TEST(AnswersInFlightTest, AwaitNoneWaitsForTheLastReleaseOrItsDeadline) {
  auto answers = std::make_shared<AnswersInFlight>();
  std::shared_ptr<const void> held = answers->Hold(std::make_shared<int>(1));
  const absl::Time started = absl::Now();
  EXPECT_FALSE(answers->AwaitNone(started + absl::Milliseconds(50)));
  EXPECT_GE(absl::Now() - started, absl::Milliseconds(50));
  std::thread releaser([&held] {
    absl::SleepFor(absl::Milliseconds(20));
    held.reset();
  });
  EXPECT_TRUE(answers->AwaitNone(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(answers->held(), 0);
  releaser.join();
  EXPECT_TRUE(answers->AwaitNone(absl::Now()));  // none: at once
}

TEST(AnswersInFlightTest, AnOwnerOutlivesTheAnswersThatMadeIt) {
  auto answers = std::make_shared<AnswersInFlight>();
  std::weak_ptr<AnswersInFlight> watched = answers;
  std::shared_ptr<const void> held = answers->Hold(std::make_shared<int>(1));
  answers.reset();
  EXPECT_FALSE(watched.expired());  // the owner shares it
  held.reset();
  EXPECT_TRUE(watched.expired());
}

}  // namespace
}  // namespace strata
