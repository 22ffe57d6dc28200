// Test helpers: a small model (and an FP32 job of it), deterministic per-(rank, step, micro-batch)
// gradients, RunClients(), which runs W connected clients as threads, and
// RunWorkers(), which trains with them against a cluster and returns every
// rank's step results and the final master state.
#ifndef STRATA_TESTING_JOB_RUNNER_H_
#define STRATA_TESTING_JOB_RUNNER_H_

#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "strata/client.h"

namespace strata::testing {

inline std::vector<TensorSpec> SmallModel() {
  return {{"w1", {37, 29}}, {"b1", {29}}, {"w2", {29, 5}}, {"b2", {5}}};
}

// Gradient of micro-batch `micro` of `rank` at `step`: N(0, 0.1) values.
inline std::vector<float> Gradient(size_t n, int rank, int64_t step, int micro) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000003 + step * 101 + micro));
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> g(n);
  for (float& x : g) x = normal(rng);
  return g;
}

// One step of `client` (one worker) on Gradient(n, 0, next step, 0).
inline absl::Status TrainStep(Client& client) {
  absl::Status s =
      client.AccumulateGradients(Gradient(client.layout().num_params(), 0, client.step() + 1, 0));
  if (!s.ok()) return s;
  return client.Step().status();
}

// Noise fixed by the micro-batch's first sample and step, plus a term in
// the parameters the worker holds, so that a step computed from the wrong
// parameters shows.
inline absl::StatusOr<std::vector<float>> ParamDependentGradientOf(const MicroBatch& batch,
                                                                   Client& client) {
  const uint64_t n = client.layout().num_params();
  std::vector<float> params(n);
  if (absl::Status s = client.CopyParams(absl::MakeSpan(params)); !s.ok()) return s;
  std::vector<float> g = Gradient(n, static_cast<int>(batch.sample_begin), batch.step, 0);
  for (uint64_t i = 0; i < n; ++i) g[i] += 0.1f * params[i];
  return g;
}

// A GradientFn: ParamDependentGradientOf(), accumulated.
inline absl::Status ParamDependentGradient(const MicroBatch& batch, Client& client) {
  absl::StatusOr<std::vector<float>> g = ParamDependentGradientOf(batch, client);
  if (!g.ok()) return g.status();
  return client.AccumulateGradients(*g);
}

// A GradientFn: ParamDependentGradientOf(), streamed (GradientsReady) in
// ranges of `range_params` in backward's reverse flat order, so that the
// step's pushes leave before its scalars are known.
inline GradientFn StreamedParamDependentGradient(uint64_t range_params) {
  return [range_params](const MicroBatch& batch, Client& client) -> absl::Status {
    absl::StatusOr<std::vector<float>> g = ParamDependentGradientOf(batch, client);
    if (!g.ok()) return g.status();
    for (uint64_t end = g->size(); end > 0;) {
      const uint64_t begin = end > range_params ? end - range_params : 0;
      absl::Status s = client.GradientsReady(FlatRange{begin, end},
                                             absl::MakeConstSpan(*g).subspan(begin, end - begin));
      if (!s.ok()) return s;
      end = begin;
    }
    return absl::OkStatus();
  };
}

inline std::vector<float> InitialParams(size_t n) {
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> p(n);
  for (float& x : p) x = normal(rng);
  return p;
}

// Options of an FP32 job of SmallModel() at `coordinator`: 2 workers,
// chunks of 256, AdamW with weight decay 0.01.
inline ClientOptions SmallFp32Job(const std::string& coordinator, const std::string& job_id) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = job_id;
  o.job.tensors = SmallModel();
  o.job.world_size = 2;
  o.job.chunk_num_params = 256;
  o.job.dtype = DType::kFp32;
  o.job.adam.weight_decay = 0.01f;
  return o;
}

// `got` holds `want`'s step and FP32 state, bit for bit.
inline void ExpectSameState(const MasterState& got, const MasterState& want) {
  EXPECT_EQ(got.step, want.step);
  ASSERT_EQ(got.params.size(), want.params.size());
  EXPECT_TRUE(got.params == want.params);
  EXPECT_TRUE(got.exp_avg == want.exp_avg);
  EXPECT_TRUE(got.exp_avg_sq == want.exp_avg_sq);
}

struct RunResult {
  std::vector<std::vector<StepResult>> steps;  // per rank
  MasterState master;
};

// Connects options.job.world_size clients ("worker-0", ...) on as many threads
// and runs `body` on each; returns when all are done.
inline void RunClients(const ClientOptions& options, const std::function<void(Client&)>& body) {
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < options.job.world_size; ++w) {
    threads.emplace_back([&, w] {
      ClientOptions mine = options;
      mine.worker_id = absl::StrCat("worker-", w);
      auto client = Client::Connect(mine);
      ASSERT_TRUE(client.ok()) << client.status();
      body(**client);
    });
  }
  for (auto& t : threads) t.join();
}

// Runs `num_steps` steps of `options` (world size W) with W threads; each
// step accumulates `micro_batches` gradients from `gradient(rank, step, micro)`.
inline RunResult RunWorkers(
    const ClientOptions& options, int num_steps, int micro_batches,
    const std::function<std::vector<float>(int rank, int64_t step, int micro)>& gradient) {
  RunResult result;
  result.steps.resize(options.job.world_size);
  RunClients(options, [&](Client& client) {
    int rank = client.rank();
    for (int s = 1; s <= num_steps; ++s) {
      for (int micro = 0; micro < micro_batches; ++micro) {
        ASSERT_TRUE(client.AccumulateGradients(gradient(rank, s, micro)).ok());
      }
      auto step = client.Step();
      ASSERT_TRUE(step.ok()) << step.status();
      result.steps[rank].push_back(*step);
    }
    if (rank == 0) {
      auto master = client.ReadMasterState();
      ASSERT_TRUE(master.ok()) << master.status();
      result.master = *std::move(master);
    }
  });
  return result;
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_JOB_RUNNER_H_
