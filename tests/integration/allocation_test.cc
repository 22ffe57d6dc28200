// AllocateChunks makes a job's chunks without holding up its shard server:
// the server answers its other calls while the memory is cleared, and a
// DropJob that comes meanwhile is honoured -- the allocation frees what it
// made and is ABORTED, leaving nothing of the job behind. A server that
// faulted memory in at start-up makes chunks of it.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_spec.h"
#include "testing/local_cluster.h"
#include "testing/metrics_scrape.h"
#include "testing/placement.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kChunkParams = uint64_t{1} << 20;
// The large job: 48 chunks of FP32 state (about 800 MB), whose clearing
// takes a good fraction of a second on any host.
constexpr uint32_t kLargeChunks = 48;

// An AllocateChunks of every chunk of an FP32 job `job_id` of
// `chunks` chunks of kChunkParams.
v1::AllocateChunksRequest Allocation(const std::string& job_id, uint32_t chunks) {
  v1::AllocateChunksRequest request;
  *request.mutable_spec() =
      testing::OneTensorSpec(job_id, chunks * kChunkParams, kChunkParams, v1::DTYPE_FP32);
  for (uint32_t i = 0; i < chunks; ++i) {
    v1::ChunkSpec* chunk = request.add_chunks();
    chunk->set_chunk_id(i);
    chunk->set_flat_begin(i * kChunkParams);
    chunk->set_num_params(kChunkParams);
  }
  return request;
}

// Waits until the server at `metrics_address` has answered the ListChunks
// with which the coordinator checks a server that registers: it drops the
// jobs it does not know that the listing shows (CheckJobsOn), so the jobs
// these tests allocate on the server directly must come after it.
void AwaitRegistrationCheck(const std::string& metrics_address) {
  const std::string listed =
      "strata_rpcs_total{code=\"OK\",method=\"/strata.v1.ShardServer/ListChunks\"}";
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (testing::MetricValue(testing::Scrape(metrics_address), listed) < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_GE(testing::MetricValue(testing::Scrape(metrics_address), listed), 1)
      << "the coordinator never listed the new server's chunks";
}

class AllocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions options;
    options.num_servers = 1;
    options.host_budget_bytes = uint64_t{2} << 30;
    options.serve_metrics = true;
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    server_ = cluster_->servers()[0]->address();
    stub_ = v1::ShardServer::NewStub(MakeChannel(server_));
    ASSERT_NO_FATAL_FAILURE(AwaitRegistrationCheck(cluster_->servers()[0]->metrics_address()));
    ASSERT_TRUE(Allocate(Allocation("small", 1)).ok());
  }

  absl::Status Allocate(const v1::AllocateChunksRequest& request) {
    v1::AllocateChunksResponse response;
    return CallUnary(stub_.get(), &v1::ShardServer::Stub::AllocateChunks, request, &response,
                     absl::Seconds(120));
  }

  double HostBytesUsed() {
    return testing::MetricValue(testing::Scrape(cluster_->servers()[0]->metrics_address()),
                                "strata_tier_used_bytes{tier=\"host\"}");
  }

  // Starts allocating the large job on a thread and returns once its
  // first chunk's memory is taken (more than `before` bytes used), with
  // most of the job still to clear. `*done` is set when the call returns.
  std::thread StartLargeAllocation(double before, absl::Status* status, std::atomic<bool>* done) {
    std::thread allocation([this, status, done] {
      *status = Allocate(Allocation("large", kLargeChunks));
      done->store(true);
    });
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (HostBytesUsed() <= before && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(200));
    }
    return allocation;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::string server_;
  std::unique_ptr<v1::ShardServer::Stub> stub_;
};

TEST_F(AllocationTest, TheServerAnswersWhileAJobsChunksAreMade) {
  const double before = HostBytesUsed();
  absl::Status allocated;
  std::atomic<bool> done{false};
  std::thread allocation = StartLargeAllocation(before, &allocated, &done);
  // Another job's chunks are listed, and the metrics scraped, meanwhile.
  auto small = testing::ChunksOnServer(server_, "small");
  const double during = HostBytesUsed();
  const bool answered_during = !done.load();
  allocation.join();
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, 1);
  EXPECT_GT(during, before);
  EXPECT_TRUE(answered_during) << "the calls waited for the allocation";
  ASSERT_TRUE(allocated.ok()) << allocated;
  auto large = testing::ChunksOnServer(server_, "large");
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(*large, static_cast<int>(kLargeChunks));
}

TEST_F(AllocationTest, ADropDuringAnAllocationFreesWhatItMade) {
  const double before = HostBytesUsed();
  absl::Status allocated;
  std::atomic<bool> done{false};
  std::thread allocation = StartLargeAllocation(before, &allocated, &done);
  v1::DropJobRequest drop;
  drop.set_job_id("large");
  v1::DropJobResponse dropped;
  const absl::Status drop_status =
      CallUnary(stub_.get(), &v1::ShardServer::Stub::DropJob, drop, &dropped, absl::Seconds(120));
  const bool dropped_during = !done.load();
  allocation.join();
  EXPECT_TRUE(drop_status.ok()) << drop_status;
  EXPECT_TRUE(dropped_during) << "the drop waited for the allocation";
  EXPECT_EQ(allocated.code(), absl::StatusCode::kAborted) << allocated;
  EXPECT_THAT(allocated.message(), HasSubstr("dropped while its chunks were allocated"));
  auto large = testing::ChunksOnServer(server_, "large");
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_EQ(*large, 0);
  EXPECT_EQ(HostBytesUsed(), before);
  // The job can be allocated again from nothing.
  ASSERT_TRUE(Allocate(Allocation("large", kLargeChunks)).ok());
  auto again = testing::ChunksOnServer(server_, "large");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, static_cast<int>(kLargeChunks));
}

// Memory faulted in at start-up (host_prefault_bytes) is kept and makes
// the chunks of the jobs that come: the tier's kept bytes turn into used
// ones, byte for byte. More than the host budget stops the start-up.
TEST(PrefaultTest, ChunksAreMadeOfMemoryFaultedInAtStartUp) {
  constexpr uint64_t kPrefaultBytes = uint64_t{64} << 20;
  LocalClusterOptions options;
  options.num_servers = 1;
  options.host_budget_bytes = uint64_t{128} << 20;
  options.host_prefault_bytes = kPrefaultBytes;
  options.serve_metrics = true;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string metrics = (*cluster)->servers()[0]->metrics_address();
  ASSERT_NO_FATAL_FAILURE(AwaitRegistrationCheck(metrics));
  auto host_bytes = [&](const std::string& gauge) {
    return testing::MetricValue(testing::Scrape(metrics),
                                absl::StrCat("strata_tier_", gauge, "_bytes{tier=\"host\"}"));
  };
  EXPECT_EQ(host_bytes("kept"), kPrefaultBytes);
  EXPECT_EQ(host_bytes("used"), 0);
  auto stub = v1::ShardServer::NewStub(MakeChannel((*cluster)->servers()[0]->address()));
  v1::AllocateChunksResponse response;
  ASSERT_TRUE(CallUnary(stub.get(), &v1::ShardServer::Stub::AllocateChunks, Allocation("job", 2),
                        &response, absl::Seconds(60))
                  .ok());
  const double used = host_bytes("used");
  EXPECT_GT(used, 2.0 * 12 * kChunkParams);  // p, m and v of 2 chunks, and their copies
  EXPECT_EQ(host_bytes("kept"), kPrefaultBytes - used);

  ShardServerOptions too_much;
  too_much.coordinator_address = "127.0.0.1:1";  // never reached
  const testing::ScratchDir scratch("prefault_test");
  too_much.data_dir = scratch.path();
  too_much.pin_host_memory = false;
  too_much.host_budget_bytes = uint64_t{64} << 20;
  too_much.host_prefault_bytes = too_much.host_budget_bytes + 1;
  auto refused = ShardServer::Start(too_much);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--host_prefault_mib"));
}

}  // namespace
}  // namespace strata
