// RendezvousStore: bounded keys and values, keys only of jobs, bounded bytes
// per job and in all (counted again after a restart), and a job's keys (and
// no other job's, even one whose id starts with it) deleted with the job.
#include "coordinator/rendezvous_store.h"

#include <string>

#include "gtest/gtest.h"
#include "rpc/rendezvous_keys.h"
#include "storage/metadata_store.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

TEST(RendezvousStoreTest, KeysAndValuesAreBounded) {
  const testing::ScratchDir scratch("rendezvous_store_test");
  auto metadata = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  RendezvousStore store(metadata->get());
  const std::string k = RendezvousPrefix("a") + "k";
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(k + std::string(RendezvousStore::kMaxKeyBytes, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(k, std::string(RendezvousStore::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
  for (const std::string& foreign :
       {std::string("k"), std::string("job/"), std::string("job/a"), std::string("job//k"),
        std::string("job/../k"), std::string("job/a b/k")}) {
    EXPECT_EQ(store.Set(foreign, "v").code(), absl::StatusCode::kInvalidArgument) << foreign;
  }
  EXPECT_EQ(store.Get(k).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set(k, std::string(RendezvousStore::kMaxValueBytes, 'v')).ok());
  EXPECT_EQ(store.Get(k)->size(), RendezvousStore::kMaxValueBytes);
}

TEST(RendezvousStoreTest, AJobsBytesAreBoundedAcrossRestartsAndFreedWithTheJob) {
  const testing::ScratchDir scratch("rendezvous_store_test");
  auto metadata = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  const std::string value(RendezvousStore::kMaxValueBytes, 'v');
  auto fill = [&](RendezvousStore& store, const std::string& job, int from) {
    int i = from;
    absl::Status s;
    while ((s = store.Set(RendezvousPrefix(job) + std::to_string(i), value)).ok()) ++i;
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    return i;
  };
  {
    RendezvousStore store(metadata->get());
    ASSERT_TRUE(store.Load().ok());
    // 1 MiB values with short keys: 63 fit in the 64 MiB of a job.
    ASSERT_EQ(fill(store, "a", 0), 63);
    // Replacing a value by a smaller one frees bytes; another job is not held back.
    ASSERT_TRUE(store.Set(RendezvousPrefix("a") + "0", "small").ok());
    EXPECT_TRUE(store.Set(RendezvousPrefix("a") + "extra", value).ok());
    EXPECT_TRUE(store.Set(RendezvousPrefix("b") + "0", value).ok());
  }
  // A restarted coordinator counts what is stored.
  RendezvousStore store(metadata->get());
  ASSERT_TRUE(store.Load().ok());
  EXPECT_EQ(store.Set(RendezvousPrefix("a") + "more", value).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Get(RendezvousPrefix("a") + "0").value_or(""), "small");
  ASSERT_TRUE(store.DeleteJob("a").ok());
  EXPECT_EQ(fill(store, "a", 0), 63);
}

TEST(RendezvousStoreTest, AJobsKeysGoWithTheJobAndNoOthers) {
  const testing::ScratchDir scratch("rendezvous_store_test");
  auto metadata = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  RendezvousStore store(metadata->get());
  const std::string mine = GenerationRendezvousPrefix("a", 3) + "rank-0";
  const std::string longer_id = GenerationRendezvousPrefix("ab", 1) + "rank-0";
  ASSERT_TRUE(store.Set(mine, "1").ok());
  ASSERT_TRUE(store.Set(RendezvousPrefix("a") + "other", "2").ok());
  ASSERT_TRUE(store.Set(longer_id, "3").ok());
  EXPECT_EQ(store.Set("not-a-job-key", "4").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.DeleteJob("a").ok());
  EXPECT_EQ(store.Get(mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(RendezvousPrefix("a") + "other").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(longer_id).value_or(""), "3");
}

}  // namespace
}  // namespace strata
