// JobTable and the job records: jobs are found by id and by their worker
// token's digest until removed; records survive in the store, one that does
// not parse is named, and deleting a job's records leaves every other job's
// (even one whose id starts with it).
#include "shard/job_table.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "shard/chunk.h"
#include "storage/metadata_store.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

v1::AllocateChunksRequest Record(const std::string& job_id, const std::string& digest) {
  v1::AllocateChunksRequest record;
  record.mutable_spec()->set_job_id(job_id);
  record.set_worker_token_sha256(digest);
  record.set_min_generation(3);
  return record;
}

std::shared_ptr<ShardJob> Job(const std::string& job_id, const std::string& digest) {
  auto job = std::make_shared<ShardJob>();
  job->record = Record(job_id, digest);
  return job;
}

TEST(JobTableTest, JobsAreFoundByIdAndTokenUntilRemoved) {
  JobTable table;
  EXPECT_EQ(table.Find("a"), nullptr);
  EXPECT_EQ(table.Remove("a"), nullptr);
  table.Add(Job("a", "digest-a"));
  table.Add(Job("b", ""));
  EXPECT_EQ(table.All().size(), 2u);
  ASSERT_NE(table.Find("a"), nullptr);
  EXPECT_EQ(table.Find("a")->record.min_generation(), 3u);
  EXPECT_EQ(table.JobOfToken("digest-a").value_or(""), "a");
  EXPECT_FALSE(table.JobOfToken("").has_value());
  std::shared_ptr<ShardJob> removed = table.Remove("a");
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->record.spec().job_id(), "a");
  EXPECT_EQ(table.Find("a"), nullptr);
  EXPECT_FALSE(table.JobOfToken("digest-a").has_value());
  ASSERT_EQ(table.All().size(), 1u);
  EXPECT_EQ(table.All().front()->record.spec().job_id(), "b");
}

TEST(JobTableTest, RecordsOfAJobGoWithItAndNoOthers) {
  const testing::ScratchDir scratch("job_table_test");
  auto opened = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  MetadataStore* metadata = opened->get();
  ASSERT_TRUE(WriteJobRecord(metadata, Record("a", "digest-a")).ok());
  ASSERT_TRUE(WriteJobRecord(metadata, Record("ab", "")).ok());
  ASSERT_TRUE(metadata->Put(Chunk::RecordKey("a", 0), "chunk of a").ok());
  ASSERT_TRUE(metadata->Put(Chunk::RecordKey("ab", 0), "chunk of ab").ok());
  auto records = ReadJobRecords(metadata);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].spec().job_id(), "a");
  EXPECT_EQ((*records)[0].worker_token_sha256(), "digest-a");

  ASSERT_TRUE(DeleteJobRecords(metadata, "a").ok());
  records = ReadJobRecords(metadata);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].spec().job_id(), "ab");
  EXPECT_FALSE(metadata->Get(Chunk::RecordKey("a", 0))->has_value());
  EXPECT_EQ(metadata->Get(Chunk::RecordKey("ab", 0))->value_or(""), "chunk of ab");

  ASSERT_TRUE(metadata->Put("job/broken", std::string("\xff\xff\xff", 3)).ok());
  records = ReadJobRecords(metadata);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(records.status().message().find("job/broken"), std::string::npos) << records.status();
}

}  // namespace
}  // namespace strata
