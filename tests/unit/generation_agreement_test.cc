// AgreeOnNewestGeneration with its workers as threads: each one's view of
// the job's generations is set by the test (as a watch stream would bring
// them), and the all-reduce sums over the threads.
#include "client/generation_agreement.h"

#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// The newest generation one worker has heard of.
class Heard {
 public:
  explicit Heard(uint64_t number) : number_(number) {}
  void Set(uint64_t number) {
    absl::MutexLock lock(&mu_);
    number_ = number;
  }
  v1::Generation Latest() {
    absl::MutexLock lock(&mu_);
    v1::Generation generation;
    generation.set_number(number_);
    return generation;
  }
  void WaitToHear(uint64_t number, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto heard = [this, number]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return number_ >= number; };
    mu_.AwaitWithDeadline(absl::Condition(&heard), deadline);
  }

 private:
  absl::Mutex mu_;
  uint64_t number_ ABSL_GUARDED_BY(mu_);
};

// An all-reduce (sum) over `ranks` threads.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int ranks) : ranks_(ranks) {}
  absl::Status Sum(absl::Span<double> values) {
    absl::MutexLock lock(&mu_);
    const int round = rounds_;
    if (arrived_ == 0) sum_.assign(values.size(), 0.0);
    for (size_t i = 0; i < values.size(); ++i) sum_[i] += values[i];
    if (++arrived_ == ranks_) {
      result_ = sum_;
      arrived_ = 0;
      ++rounds_;
    } else {
      auto done = [this, round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rounds_ != round; };
      mu_.Await(absl::Condition(&done));
    }
    std::copy(result_.begin(), result_.end(), values.begin());
    return absl::OkStatus();
  }
  int rounds() {
    absl::MutexLock lock(&mu_);
    return rounds_;
  }

 private:
  const int ranks_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int rounds_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<double> result_ ABSL_GUARDED_BY(mu_);
};

constexpr uint64_t kGroupGeneration = 5;

// Runs the agreement on one thread per entry of `heard` (each worker's view)
// and returns what each worker agreed on (0 for none); `meanwhile` runs
// beside them (to bring generations late).
std::vector<uint64_t> Agree(std::vector<Heard*> heard, ThreadAllReduce& all_reduce,
                            absl::Duration hear_wait, const std::function<void()>& meanwhile) {
  std::vector<uint64_t> agreed(heard.size(), 0);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < heard.size(); ++w) {
    workers.emplace_back([&, w] {
      absl::StatusOr<std::optional<v1::Generation>> result = AgreeOnNewestGeneration(
          kGroupGeneration, static_cast<uint32_t>(heard.size()), hear_wait,
          absl::Now() + absl::Seconds(30), [&] { return heard[w]->Latest(); },
          [&](uint64_t number, absl::Time deadline) { heard[w]->WaitToHear(number, deadline); },
          [&](absl::Span<double> values) { return all_reduce.Sum(values); });
      ASSERT_TRUE(result.ok()) << result.status();
      if (result->has_value()) agreed[w] = (*result)->number();
    });
  }
  meanwhile();
  for (std::thread& t : workers) t.join();
  return agreed;
}

TEST(GenerationAgreementTest, WorkersThatHeardTheSameGenerationAgreeInOneRound) {
  Heard a(6), b(6);
  ThreadAllReduce all_reduce(2);
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Seconds(10), [] {}), (std::vector<uint64_t>{6, 6}));
  EXPECT_EQ(all_reduce.rounds(), 1);
}

// One worker has heard of N+1, the other of N+2 already (a generation
// opened just after another): the first waits to hear of N+2 and both
// follow it.
TEST(GenerationAgreementTest, AWorkerBehindWaitsToHearTheNewestOne) {
  Heard a(6), b(7);
  ThreadAllReduce all_reduce(2);
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Seconds(10),
                  [&] {
                    absl::SleepFor(absl::Milliseconds(100));
                    a.Set(7);
                  }),
            (std::vector<uint64_t>{7, 7}));
  EXPECT_EQ(all_reduce.rounds(), 2);
}

TEST(GenerationAgreementTest, ThreeWorkersAtThreeGenerationsAgreeOnTheNewest) {
  Heard a(6), b(7), c(8);
  ThreadAllReduce all_reduce(3);
  EXPECT_EQ(Agree({&a, &b, &c}, all_reduce, absl::Seconds(10),
                  [&] {
                    absl::SleepFor(absl::Milliseconds(50));
                    b.Set(8);
                    absl::SleepFor(absl::Milliseconds(50));
                    a.Set(8);
                  }),
            (std::vector<uint64_t>{8, 8, 8}));
  EXPECT_EQ(all_reduce.rounds(), 2);
}

// A generation that comes while the group agrees on an older one is
// agreed on instead, when every worker hears of it.
TEST(GenerationAgreementTest, AGenerationThatComesDuringTheRoundsIsTheOneAgreedOn) {
  Heard a(6), b(7);
  ThreadAllReduce all_reduce(2);
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Seconds(10),
                  [&] {
                    absl::SleepFor(absl::Milliseconds(50));
                    b.Set(8);
                    a.Set(8);
                  }),
            (std::vector<uint64_t>{8, 8}));
}

TEST(GenerationAgreementTest, AWorkerThatNeverHearsOfTheNewestMakesTheGroupReform) {
  Heard a(6), b(7);
  ThreadAllReduce all_reduce(2);
  const absl::Time started = absl::Now();
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Milliseconds(50), [] {}),
            (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(all_reduce.rounds(), kAgreeRounds);
  // Worker a waited in each round after the first for what it never heard of.
  EXPECT_GE(absl::Now() - started, (kAgreeRounds - 1) * absl::Milliseconds(50));
}

TEST(GenerationAgreementTest, WithNoNewerGenerationTheGroupsOwnIsAgreedOn) {
  Heard a(kGroupGeneration), b(kGroupGeneration);
  ThreadAllReduce all_reduce(2);
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Milliseconds(20), [] {}),
            (std::vector<uint64_t>{kGroupGeneration, kGroupGeneration}));
  EXPECT_EQ(all_reduce.rounds(), 1);
}

TEST(GenerationAgreementTest, AGenerationTooFarAheadToTellApartMakesTheGroupReform) {
  Heard a(kGroupGeneration + kAgreeSlots), b(kGroupGeneration + kAgreeSlots);
  ThreadAllReduce all_reduce(2);
  EXPECT_EQ(Agree({&a, &b}, all_reduce, absl::Seconds(10), [] {}), (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(all_reduce.rounds(), 1);
}

TEST(GenerationAgreementTest, TheAllReducesErrorIsReturned) {
  Heard a(6);
  absl::StatusOr<std::optional<v1::Generation>> result = AgreeOnNewestGeneration(
      kGroupGeneration, 1, absl::Seconds(10), absl::Now() + absl::Seconds(30),
      [&] { return a.Latest(); },
      [&](uint64_t number, absl::Time deadline) { a.WaitToHear(number, deadline); },
      [](absl::Span<double>) { return absl::AbortedError("the group was abandoned"); });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted) << result.status();
}

}  // namespace
}  // namespace strata
