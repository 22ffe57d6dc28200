// PlaceChunks (coordinator/placement.h), the pure placement function: chunks
// go to the live server with the largest share of its capacity free, other
// jobs' chunks count, a chunk's copies go to distinct servers, and a job
// that fits nowhere is refused by name.
#include "coordinator/placement.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "coordinator/job_info.h"
#include "core/chunk_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

v1::ServerRecord Server(const std::string& address, uint64_t host_bytes, uint64_t nvme_bytes = 0) {
  v1::ServerRecord server;
  server.set_address(address);
  server.set_host_budget_bytes(host_bytes);
  server.set_nvme_budget_bytes(nvme_bytes);
  return server;
}

// A job of `num_chunks` FP32 chunks of `chunk_params` each, not yet placed.
v1::JobInfo Job(const std::string& id, int num_chunks, uint64_t chunk_params) {
  v1::JobInfo job;
  job.mutable_spec()->set_job_id(id);
  job.mutable_spec()->set_dtype(v1::DTYPE_FP32);
  for (int c = 0; c < num_chunks; ++c) {
    v1::ChunkSpec* chunk = job.add_chunks()->mutable_chunk();
    chunk->set_chunk_id(c);
    chunk->set_flat_begin(c * chunk_params);
    chunk->set_num_params(chunk_params);
  }
  job.set_flat_num_params(num_chunks * chunk_params);
  return job;
}

std::map<std::string, int> ChunksPerServer(const v1::JobInfo& job) {
  std::map<std::string, int> count;
  for (const auto& c : job.chunks()) ++count[c.server_address()];
  return count;
}

constexpr uint64_t kChunkParams = 1024;
const uint64_t kChunkBytes = ChunkBytes(kChunkParams, DType::kFp32, StatePrecision::kFp32);

TEST(PlacementTest, CapacityIsGpuAndHostAndNvme) {
  v1::ServerRecord server = Server("a", 1000, 600);
  server.set_gpu_budget_bytes(50);
  EXPECT_EQ(ServerCapacityBytes(server), 1000u + 600u + 50u);
}

TEST(PlacementTest, ServersOfOneSizeTakeTurns) {
  v1::JobInfo job = Job("j", 6, kChunkParams);
  ASSERT_TRUE(PlaceChunks({Server("a", 10 * kChunkBytes), Server("b", 10 * kChunkBytes),
                           Server("c", 10 * kChunkBytes)},
                          {}, &job)
                  .ok());
  EXPECT_EQ(ChunksPerServer(job), (std::map<std::string, int>{{"a", 2}, {"b", 2}, {"c", 2}}));
  // Ties go to the smallest address, then the others take their turn.
  EXPECT_EQ(job.chunks(0).server_address(), "a");
  EXPECT_EQ(job.chunks(1).server_address(), "b");
  EXPECT_EQ(job.chunks(2).server_address(), "c");
}

TEST(PlacementTest, ChunksFollowTheShareFreeNotTheBytesFree) {
  // b is four times a's size: it takes four chunks for each of a's.
  v1::JobInfo job = Job("j", 10, kChunkParams);
  ASSERT_TRUE(
      PlaceChunks({Server("a", 4 * kChunkBytes), Server("b", 16 * kChunkBytes)}, {}, &job).ok());
  EXPECT_EQ(ChunksPerServer(job), (std::map<std::string, int>{{"a", 2}, {"b", 8}}));
}

TEST(PlacementTest, OtherJobsChunksTakeTheirBytesAndTheJobItselfDoesNot) {
  v1::JobInfo other = Job("other", 3, kChunkParams);
  for (auto& c : *other.mutable_chunks()) c.set_server_address("a");
  // The job's own old placement (a move) is not counted against it.
  v1::JobInfo old_self = Job("j", 3, kChunkParams);
  for (auto& c : *old_self.mutable_chunks()) c.set_server_address("b");
  v1::JobInfo job = Job("j", 3, kChunkParams);
  ASSERT_TRUE(PlaceChunks({Server("a", 4 * kChunkBytes), Server("b", 4 * kChunkBytes)},
                          {&other, &old_self}, &job)
                  .ok());
  // a has one chunk free, b four: b takes the first three turns' worth.
  EXPECT_EQ(ChunksPerServer(job), (std::map<std::string, int>{{"b", 3}}));
}

TEST(PlacementTest, AChunkTooBigForEveryServerIsRefusedByName) {
  v1::JobInfo job = Job("big", 3, kChunkParams);
  absl::Status s =
      PlaceChunks({Server("a", kChunkBytes + 10), Server("b", kChunkBytes + 10)}, {}, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("job 'big' does not fit"));
  EXPECT_THAT(s.message(), HasSubstr("2 live shard server(s) have 20 bytes free"));
}

TEST(PlacementTest, NoLiveServerIsAFailedPrecondition) {
  v1::JobInfo job = Job("j", 1, kChunkParams);
  EXPECT_EQ(PlaceChunks({}, {}, &job).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PlacementTest, ReplicasGoToDistinctServersAndCountAgainstTheirBudgets) {
  v1::JobInfo job = Job("j", 6, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  ASSERT_TRUE(PlaceChunks({Server("a", 4 * kChunkBytes), Server("b", 4 * kChunkBytes),
                           Server("c", 4 * kChunkBytes)},
                          {}, &job)
                  .ok());
  std::map<std::string, int> copies;
  for (const auto& c : job.chunks()) {
    ASSERT_EQ(c.replica_addresses_size(), 1) << "chunk " << c.chunk().chunk_id();
    EXPECT_NE(c.server_address(), c.replica_addresses(0)) << "chunk " << c.chunk().chunk_id();
    ++copies[c.server_address()];
    ++copies[c.replica_addresses(0)];
  }
  // 12 copies over three servers of one size: four each, their budgets full;
  // and two primaries each (the pulls spread over the servers).
  EXPECT_EQ(copies, (std::map<std::string, int>{{"a", 4}, {"b", 4}, {"c", 4}}));
  EXPECT_EQ(ChunksPerServer(job), (std::map<std::string, int>{{"a", 2}, {"b", 2}, {"c", 2}}));
  // Another job's replicas take their bytes: nothing is left for one more chunk.
  v1::JobInfo more = Job("more", 1, kChunkParams);
  absl::Status s = PlaceChunks(
      {Server("a", 4 * kChunkBytes), Server("b", 4 * kChunkBytes), Server("c", 4 * kChunkBytes)},
      {&job}, &more);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(PlacementTest, PrimariesSpreadOverServersHoldingEveryCopy) {
  // Two servers, two copies: each holds every chunk; each serves half the pulls.
  v1::JobInfo job = Job("j", 4, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  ASSERT_TRUE(
      PlaceChunks({Server("a", 8 * kChunkBytes), Server("b", 8 * kChunkBytes)}, {}, &job).ok());
  EXPECT_EQ(ChunksPerServer(job), (std::map<std::string, int>{{"a", 2}, {"b", 2}}));
}

TEST(PlacementTest, MoreReplicasThanLiveServersIsAFailedPrecondition) {
  v1::JobInfo job = Job("j", 1, kChunkParams);
  job.mutable_spec()->set_replicas(3);
  absl::Status s =
      PlaceChunks({Server("a", 4 * kChunkBytes), Server("b", 4 * kChunkBytes)}, {}, &job);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("3 copies of each chunk"));
  EXPECT_THAT(s.message(), HasSubstr("2 live server(s)"));
}

// Copies per server: each chunk's copies on distinct servers.
std::map<std::string, int> CopiesPerServer(const v1::JobInfo& job) {
  std::map<std::string, int> count;
  for (const auto& c : job.chunks()) {
    std::set<std::string> distinct;
    for (const std::string& address : CopiesOf(c)) {
      EXPECT_TRUE(distinct.insert(address).second)
          << "two copies of chunk " << c.chunk().chunk_id() << " on " << address;
      ++count[address];
    }
  }
  return count;
}

TEST(PlacementTest, ALostServersCopiesAreRestoredOnTheServersLeft) {
  v1::JobInfo job = Job("j", 6, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  const auto server = [](const std::string& a) { return Server(a, 8 * kChunkBytes); };
  ASSERT_TRUE(PlaceChunks({server("a"), server("b"), server("c")}, {}, &job).ok());
  RemoveCopies({"b"}, &job);
  for (const auto& c : job.chunks()) {
    EXPECT_FALSE(HoldsCopy(c, "b"));
    EXPECT_FALSE(c.server_address().empty());  // a primary's place went to its replica
  }
  EXPECT_EQ(AddMissingCopies({server("a"), server("c")}, {&job}, &job), 4);
  EXPECT_EQ(CopiesPerServer(job), (std::map<std::string, int>{{"a", 6}, {"c", 6}}));
  // Nothing short: nothing added.
  EXPECT_EQ(AddMissingCopies({server("a"), server("c")}, {}, &job), 0);
}

TEST(PlacementTest, ADrainedServersOnlyCopiesMoveAndAChunkTooShortStaysShort) {
  v1::JobInfo job = Job("j", 4, kChunkParams);
  ASSERT_TRUE(
      PlaceChunks({Server("a", 8 * kChunkBytes), Server("b", 8 * kChunkBytes)}, {}, &job).ok());
  RemoveCopies({"a"}, &job);
  EXPECT_EQ(
      AddMissingCopies({Server("b", 8 * kChunkBytes), Server("c", 3 * kChunkBytes)}, {}, &job), 2);
  // a's two chunks: the empty c takes the first, then b (now the larger share free).
  for (const auto& c : job.chunks()) EXPECT_EQ(c.replica_addresses_size(), 0);
  EXPECT_EQ(CopiesPerServer(job), (std::map<std::string, int>{{"b", 3}, {"c", 1}}));
  // Where nothing fits, a chunk keeps no copy and nothing is added.
  v1::JobInfo lost = Job("lost", 1, kChunkParams);
  lost.mutable_chunks(0)->set_server_address("gone");
  RemoveCopies({"gone"}, &lost);
  EXPECT_EQ(AddMissingCopies({Server("b", kChunkBytes / 2)}, {}, &lost), 0);
  EXPECT_TRUE(lost.chunks(0).server_address().empty());
}

TEST(PlacementTest, RebalanceSpreadsCopiesOntoANewServerAndStops) {
  v1::JobInfo job = Job("j", 6, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  const auto server = [](const std::string& a) { return Server(a, 12 * kChunkBytes); };
  ASSERT_TRUE(PlaceChunks({server("a"), server("b"), server("c")}, {}, &job).ok());
  // 12 copies on 4 servers of one size: 3 each.
  EXPECT_EQ(RebalanceCopies({server("a"), server("b"), server("c"), server("d")}, {}, &job), 3);
  EXPECT_EQ(CopiesPerServer(job),
            (std::map<std::string, int>{{"a", 3}, {"b", 3}, {"c", 3}, {"d", 3}}));
  for (const auto& c : job.chunks()) EXPECT_EQ(c.replica_addresses_size(), 1);
  // Balanced: nothing moves.
  EXPECT_EQ(RebalanceCopies({server("a"), server("b"), server("c"), server("d")}, {}, &job), 0);
}

v1::ServerRecord ZonedServer(const std::string& address, const std::string& zone,
                             uint64_t host_bytes) {
  v1::ServerRecord server = Server(address, host_bytes);
  server.set_zone(zone);
  return server;
}

// The zones each chunk's copies are in.
std::vector<std::set<std::string>> ZonesPerChunk(const v1::JobInfo& job,
                                                 const std::vector<v1::ServerRecord>& servers) {
  std::map<std::string, std::string> zone;
  for (const auto& s : servers) zone[s.address()] = s.zone();
  std::vector<std::set<std::string>> zones;
  for (const auto& c : job.chunks()) {
    zones.emplace_back();
    for (const std::string& address : CopiesOf(c)) zones.back().insert(zone.at(address));
  }
  return zones;
}

TEST(PlacementTest, CopiesGoToDistinctZonesWhereTheFleetAllows) {
  v1::JobInfo job = Job("j", 8, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  // Without zones, a and b (the smallest addresses, one share free) would
  // take the two copies of chunk 0.
  const std::vector<v1::ServerRecord> servers = {
      ZonedServer("a", "r1", 16 * kChunkBytes), ZonedServer("b", "r1", 16 * kChunkBytes),
      ZonedServer("c", "r2", 16 * kChunkBytes), ZonedServer("d", "r2", 16 * kChunkBytes)};
  ASSERT_TRUE(PlaceChunks(servers, {}, &job).ok());
  for (const auto& zones : ZonesPerChunk(job, servers)) {
    EXPECT_EQ(zones, (std::set<std::string>{"r1", "r2"}));
  }
  EXPECT_EQ(CopiesPerServer(job),
            (std::map<std::string, int>{{"a", 4}, {"b", 4}, {"c", 4}, {"d", 4}}));
}

TEST(PlacementTest, CopiesShareAZoneWhenNoOtherZoneHasRoom) {
  v1::JobInfo job = Job("j", 4, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  // Zone r2 has room for one copy: the other chunks' copies share r1.
  const std::vector<v1::ServerRecord> servers = {ZonedServer("a", "r1", 8 * kChunkBytes),
                                                 ZonedServer("b", "r1", 8 * kChunkBytes),
                                                 ZonedServer("c", "r2", kChunkBytes)};
  ASSERT_TRUE(PlaceChunks(servers, {}, &job).ok());
  int spread = 0;
  for (const auto& zones : ZonesPerChunk(job, servers)) spread += zones.size() == 2 ? 1 : 0;
  EXPECT_EQ(spread, 1);
  for (const auto& c : job.chunks()) EXPECT_NE(c.server_address(), c.replica_addresses(0));
}

TEST(PlacementTest, ALostCopyIsRestoredInTheZoneThatLacksOne) {
  v1::JobInfo job = Job("j", 4, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  std::vector<v1::ServerRecord> servers = {
      ZonedServer("a", "r1", 8 * kChunkBytes), ZonedServer("b", "r1", 64 * kChunkBytes),
      ZonedServer("c", "r2", 8 * kChunkBytes), ZonedServer("d", "r2", 8 * kChunkBytes)};
  ASSERT_TRUE(PlaceChunks(servers, {}, &job).ok());
  // c is lost: its copies go to d, in c's zone, though b is the freest.
  RemoveCopies({"c"}, &job);
  servers.erase(servers.begin() + 2);
  EXPECT_GT(AddMissingCopies(servers, {}, &job), 0);
  for (const auto& zones : ZonesPerChunk(job, servers)) {
    EXPECT_EQ(zones, (std::set<std::string>{"r1", "r2"}));
  }
}

TEST(PlacementTest, RebalanceMovesNoCopyIntoAZoneOfTheChunk) {
  v1::JobInfo job = Job("j", 6, kChunkParams);
  job.mutable_spec()->set_replicas(2);
  const uint64_t bytes = 12 * kChunkBytes;
  std::vector<v1::ServerRecord> servers = {ZonedServer("a", "r1", bytes),
                                           ZonedServer("b", "r2", bytes)};
  ASSERT_TRUE(PlaceChunks(servers, {}, &job).ok());
  // c joins r1: only a's copies may move to it (b's would leave a chunk in
  // r1 alone), so b keeps its 6.
  servers.push_back(ZonedServer("c", "r1", bytes));
  EXPECT_EQ(RebalanceCopies(servers, {}, &job), 3);
  EXPECT_EQ(CopiesPerServer(job), (std::map<std::string, int>{{"a", 3}, {"b", 6}, {"c", 3}}));
  for (const auto& zones : ZonesPerChunk(job, servers)) {
    EXPECT_EQ(zones, (std::set<std::string>{"r1", "r2"}));
  }
}

}  // namespace
}  // namespace strata
