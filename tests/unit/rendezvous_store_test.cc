// RendezvousStore: bounded keys and values, and a job's keys (and no other
// job's, even one whose id starts with it) deleted with the job.
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
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(std::string(RendezvousStore::kMaxKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set("k", std::string(RendezvousStore::kMaxValueBytes + 1, 'v')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set("k", std::string(RendezvousStore::kMaxValueBytes, 'v')).ok());
  EXPECT_EQ(store.Get("k")->size(), RendezvousStore::kMaxValueBytes);
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
  ASSERT_TRUE(store.Set("not-a-job-key", "4").ok());
  ASSERT_TRUE(store.DeleteJob("a").ok());
  EXPECT_EQ(store.Get(mine).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(RendezvousPrefix("a") + "other").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get(longer_id).value_or(""), "3");
  EXPECT_EQ(store.Get("not-a-job-key").value_or(""), "4");
}

}  // namespace
}  // namespace strata
