// JobRegistry: what it records survives a restart (a new registry over the
// same store), jobs are found by their worker token's digest until deleted,
// and a record that does not parse fails the load by its key and leaves the
// registry as it was.
#include "coordinator/job_registry.h"

#include <string>

#include "gtest/gtest.h"
#include "rpc/token.h"
#include "storage/metadata_store.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

v1::JobInfo Job(const std::string& id, const std::string& token, uint64_t placement_version) {
  v1::JobInfo job;
  job.mutable_spec()->set_job_id(id);
  job.set_worker_token(token);
  job.set_placement_version(placement_version);
  job.add_chunks()->set_server_address("s1:1");
  return job;
}

TEST(JobRegistryTest, RecordsSurviveARestartAndDeletedJobsGo) {
  const testing::ScratchDir scratch("job_registry_test");
  auto metadata = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  {
    JobRegistry registry(metadata->get());
    ASSERT_TRUE(registry.Load().ok());
    v1::ServerRecord server;
    server.set_address("s1:1");
    server.set_host_budget_bytes(1 << 20);
    ASSERT_TRUE(registry.PutServer(server).ok());
    server.set_draining(true);
    ASSERT_TRUE(registry.PutServer(server).ok());
    ASSERT_TRUE(registry.PutJob(Job("a", "token-a", 1)).ok());
    ASSERT_TRUE(registry.PutJob(Job("a", "token-a", 2)).ok());
    ASSERT_TRUE(registry.PutJob(Job("b", "", 1)).ok());
  }
  JobRegistry registry(metadata->get());
  ASSERT_TRUE(registry.Load().ok());
  ASSERT_EQ(registry.servers().size(), 1u);
  ASSERT_NE(registry.FindServer("s1:1"), nullptr);
  EXPECT_TRUE(registry.FindServer("s1:1")->draining());
  EXPECT_EQ(registry.FindServer("s2:1"), nullptr);
  ASSERT_EQ(registry.jobs().size(), 2u);
  ASSERT_NE(registry.FindJob("a"), nullptr);
  EXPECT_EQ(registry.FindJob("a")->placement_version(), 2u);
  EXPECT_EQ(registry.JobOfToken(TokenDigest("token-a")).value_or(""), "a");
  EXPECT_FALSE(registry.JobOfToken(TokenDigest("token-b")).has_value());

  EXPECT_EQ(registry.DeleteJob("c").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry.DeleteJob("a").ok());
  EXPECT_EQ(registry.FindJob("a"), nullptr);
  EXPECT_FALSE(registry.JobOfToken(TokenDigest("token-a")).has_value());
  JobRegistry reloaded(metadata->get());
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(reloaded.FindJob("a"), nullptr);
  EXPECT_NE(reloaded.FindJob("b"), nullptr);
  EXPECT_EQ(reloaded.jobs().size(), 1u);
}

TEST(JobRegistryTest, ARecordThatDoesNotParseFailsTheLoadByName) {
  const testing::ScratchDir scratch("job_registry_test");
  auto metadata = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  JobRegistry registry(metadata->get());
  ASSERT_TRUE(registry.PutJob(Job("a", "token-a", 1)).ok());
  ASSERT_TRUE((*metadata)->Put("job/broken", std::string("\xff\xff\xff", 3)).ok());
  const absl::Status loaded = registry.Load();
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_NE(loaded.message().find("job/broken"), std::string::npos) << loaded;
  ASSERT_NE(registry.FindJob("a"), nullptr);
  EXPECT_EQ(registry.JobOfToken(TokenDigest("token-a")).value_or(""), "a");
}

}  // namespace
}  // namespace strata
