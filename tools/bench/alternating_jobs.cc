#include "tools/bench/alternating_jobs.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace strata {
namespace {

// Whose turn it is: turn t is job t % 2's, and ends once each of that job's
// `workers` workers has called Done(t). After Fail(), every wait returns
// false at once. Thread-safe.
class Turns {
 public:
  explicit Turns(int workers) : workers_(workers) {}

  // Waits until turn `turn` begins; false if a worker failed first.
  bool WaitFor(int turn) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, turn]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return failed_ || turn_ == turn; };
    mu_.Await(absl::Condition(&ready));
    return !failed_;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    if (++done_ == workers_) {
      done_ = 0;
      ++turn_;
    }
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }

 private:
  const int workers_;
  absl::Mutex mu_;
  int turn_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;  // workers done with turn_
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// fn(job 0's, job 1's) of each turn both jobs of `series` have.
template <typename Fn>
std::vector<double> PerTurn(const std::array<std::vector<double>, 2>& series, Fn fn) {
  std::vector<double> out;
  for (size_t i = 0; i < std::min(series[0].size(), series[1].size()); ++i) {
    out.push_back(fn(series[0][i], series[1][i]));
  }
  return out;
}

}  // namespace

std::vector<double> AlternatingSteps::Ratios() const {
  return PerTurn(seconds, [](double job_0, double job_1) { return job_1 / job_0; });
}

std::vector<double> AlternatingSteps::CpuRatios() const {
  return PerTurn(cpu_seconds,
                 [](double job_0, double job_1) { return job_0 > 0 ? job_1 / job_0 : 0; });
}

std::vector<double> AlternatingSteps::AddedCpuSeconds() const {
  return PerTurn(cpu_seconds, [](double job_0, double job_1) { return job_1 - job_0; });
}

std::vector<double> AlternatingSteps::FloorRatios(double added_cpu_s) const {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<double> floors;
  for (size_t i = 0; i < std::min(seconds[1].size(), cpu_seconds[0].size()); ++i) {
    const double step_s = seconds[0][i];
    floors.push_back(std::max(step_s, (cpu_seconds[0][i] + added_cpu_s) / cores) / step_s);
  }
  return floors;
}

absl::StatusOr<AlternatingSteps> TrainAlternately(const std::array<ClientOptions, 2>& jobs,
                                                  const std::vector<float>& grads, int workers,
                                                  int turns, int steps_per_turn,
                                                  const std::function<double()>& cpu_seconds) {
  AlternatingSteps out;
  absl::Mutex mu;  // guards out and error
  absl::Status error;
  Turns turn_of(workers);
  auto fail = [&](const absl::Status& status) {
    turn_of.Fail();
    absl::MutexLock lock(&mu);
    if (error.ok()) error = status;
  };
  // Each job's first turn is untimed; turn t is job t % 2's.
  const int all_turns = 2 * (turns + 1);
  std::vector<std::thread> threads;
  for (int job = 0; job < 2; ++job) {
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, job, w] {
        ClientOptions options = jobs[job];
        options.worker_id = absl::StrCat(options.job_id, "-", w);
        absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
        if (!client.ok()) return fail(client.status());
        auto compute = [&grads](const MicroBatch&, Client& c) {
          return c.AccumulateGradients(grads);
        };
        for (int turn = job; turn < all_turns; turn += 2) {
          if (!turn_of.WaitFor(turn)) return;
          for (int s = 0; s < steps_per_turn; ++s) {
            const bool last = s + 1 == steps_per_turn;
            if (turn + 2 >= all_turns && last) (*client)->AnnounceLeave();
            const bool timed = last && turn >= 2;
            const double cpu_started = timed && cpu_seconds ? cpu_seconds() : 0;
            const absl::Time started = absl::Now();
            absl::StatusOr<StepResult> result = (*client)->Step(compute);
            if (!result.ok()) return fail(result.status());
            if (timed && (*client)->rank() == 0) {
              const double step_s = absl::ToDoubleSeconds(absl::Now() - started);
              const double cpu_s = cpu_seconds ? cpu_seconds() - cpu_started : 0;
              absl::MutexLock lock(&mu);
              out.seconds[job].push_back(step_s);
              if (cpu_seconds) out.cpu_seconds[job].push_back(cpu_s);
            }
          }
          turn_of.Done();
        }
        if (absl::Status left = (*client)->Leave(); !left.ok()) fail(left);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu);
  RETURN_IF_ERROR(error);
  return out;
}

}  // namespace strata
