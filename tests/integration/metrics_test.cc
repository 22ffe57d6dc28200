// The daemons' Prometheus endpoints, scraped over HTTP while a job trains:
// tier budgets and chunks, bytes pushed and pulled, apply times, RPCs by
// method and code (errors included), and the job's members and generation.

#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "shard/state_arena.h"
#include "strata/client.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"

namespace strata {
namespace {

TEST(MetricsTest, ServersAndCoordinatorExportWhatOperatorsWatch) {
  LocalClusterOptions options;
  options.num_servers = 1;
  options.host_budget_bytes = uint64_t{64} << 20;
  options.checkpoint_buffer_bytes = uint64_t{1} << 20;
  options.checkpoint_memory_limit_bytes = uint64_t{256} << 20;
  options.serve_metrics = true;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o;
  o.coordinator_address = (*cluster)->coordinator_address();
  o.job_id = "metrics-job";
  o.job.tensors = testing::SmallModel();
  o.job.chunk_num_params = 256;
  const int kSteps = 3;
  testing::RunResult run = testing::RunWorkers(o, kSteps, 1, [&](int rank, int64_t step, int m) {
    return testing::Gradient(FlatLayout::Create(o.job.tensors, 256)->num_params(), rank, step, m);
  });
  ASSERT_EQ(run.master.step, kSteps);
  // One refused push: counted by its code.
  const std::string server = (*cluster)->servers()[0]->address();
  auto stub = v1::ShardServer::NewStub(MakeChannel(server));
  v1::PushRequest bad;
  bad.set_job_id("no-such-job");
  bad.set_step(1);
  bad.set_num_params(1);
  bad.set_dtype(v1::DTYPE_FP16);
  bad.set_grads("xx");
  v1::PushResponse unused;
  ASSERT_FALSE(
      CallUnary(stub.get(), &v1::ShardServer::Stub::Push, bad, &unused, absl::Seconds(10)).ok());

  std::string text = testing::Scrape((*cluster)->servers()[0]->metrics_address());
  ASSERT_FALSE(text.empty());
  const uint64_t n = FlatLayout::Create(o.job.tensors, 256)->num_params();
  const double chunks = static_cast<double>((n + 255) / 256);
  EXPECT_EQ(testing::MetricValue(text, "strata_tier_budget_bytes{tier=\"host\"}"),
            options.host_budget_bytes);
  EXPECT_EQ(testing::MetricValue(text, "strata_tier_chunks{tier=\"host\"}"), chunks);
  // The chunks' bytes, each extent rounded up to the tier's 64-byte alignment.
  const double used = testing::MetricValue(text, "strata_tier_used_bytes{tier=\"host\"}");
  EXPECT_GE(used, static_cast<double>(ChunkBytes(n, DType::kFp16, StatePrecision::kFp32)));
  EXPECT_LE(used, static_cast<double>(ChunkBytes(n, DType::kFp16, StatePrecision::kFp32)) +
                      2 * 64 * chunks);
  // Extents under 64 KiB are not kept when freed (none is freed here).
  EXPECT_EQ(testing::MetricValue(text, "strata_tier_kept_bytes{tier=\"host\"}"), 0);
  // Every parameter pushed once per step (2 bytes), pulled at connect and per step.
  EXPECT_EQ(testing::MetricValue(text, "strata_pushed_bytes_total"), 2.0 * n * kSteps);
  EXPECT_EQ(testing::MetricValue(text, "strata_pulled_bytes_total"), 2.0 * n * (kSteps + 1));
  EXPECT_EQ(testing::MetricValue(text, "strata_chunk_apply_seconds_count"), chunks * kSteps);
  EXPECT_GE(testing::MetricValue(
                text, "strata_rpcs_total{code=\"OK\",method=\"/strata.v1.ShardServer/Push\"}"),
            chunks * kSteps);
  EXPECT_EQ(
      testing::MetricValue(
          text, "strata_rpcs_total{code=\"NOT_FOUND\",method=\"/strata.v1.ShardServer/Push\"}"),
      1);
  EXPECT_EQ(testing::MetricValue(text, "strata_checkpoint_memory_bytes{kind=\"limit\"}"),
            options.checkpoint_memory_limit_bytes);
  EXPECT_EQ(testing::MetricValue(text, "strata_checkpoint_memory_bytes{kind=\"taken\"}"), 0);
  EXPECT_EQ(testing::MetricValue(text, "strata_checkpoint_memory_bytes{kind=\"held\"}"),
            options.checkpoint_buffer_bytes);  // the region holds the job's pieces
  // One page per chunk (256 parameters' p, m and v fit in one).
  EXPECT_EQ(testing::MetricValue(text, "strata_checkpoint_memory_bytes{kind=\"reserved\"}"),
            chunks * StateArena::kAlignment);
  EXPECT_EQ(testing::MetricValue(text, "strata_checkpoint_memory_refused_bytes_total"), 0);

  // The worker trained in generation 1; its client is gone (closed without
  // leaving), which opens generation 2 without it as soon as the
  // coordinator sees the connection close.
  std::string coordinator = testing::Scrape((*cluster)->coordinator_metrics_address());
  for (int i = 0;
       i < 100 && testing::MetricValue(coordinator, "strata_job_members{job=\"metrics-job\"}") > 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    coordinator = testing::Scrape((*cluster)->coordinator_metrics_address());
  }
  EXPECT_EQ(testing::MetricValue(coordinator, "strata_servers"), 1);
  EXPECT_EQ(testing::MetricValue(coordinator, "strata_jobs"), 1);
  EXPECT_EQ(testing::MetricValue(coordinator, "strata_job_generation{job=\"metrics-job\"}"), 2);
  EXPECT_EQ(testing::MetricValue(coordinator, "strata_job_members{job=\"metrics-job\"}"), 0);
  EXPECT_GE(
      testing::MetricValue(
          coordinator, "strata_rpcs_total{code=\"OK\",method=\"/strata.v1.Coordinator/JoinJob\"}"),
      1);
}

}  // namespace
}  // namespace strata
