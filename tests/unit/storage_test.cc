#include <cstring>
#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "storage/host_tier.h"
#include "storage/metadata_store.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

TEST(HostTierTest, KeepsWithinBudgetAndRoundTrips) {
  HostTier tier(4096);
  auto a = tier.Allocate(3000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(tier.used_bytes(), 3008u);
  auto b = tier.Allocate(2000);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tier.used_bytes(), 3008u);
  std::vector<std::byte> in(100, std::byte{7}), out(100);
  absl::Status written, read;
  tier.Write(*a, 10, in, [&](absl::Status s) { written = s; });
  tier.Read(*a, 10, absl::MakeSpan(out), [&](absl::Status s) { read = s; });
  EXPECT_TRUE(written.ok());
  EXPECT_TRUE(read.ok());
  EXPECT_EQ(in, out);
  absl::Status outside;
  tier.Read(*a, 2950, absl::MakeSpan(out), [&](absl::Status s) { outside = s; });
  EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange);
  tier.Free(*a);
  EXPECT_EQ(tier.used_bytes(), 0u);
  EXPECT_TRUE(tier.Allocate(4096).ok());
}

TEST(MetadataStoreTest, PutGetScanDeletePersist) {
  const testing::ScratchDir scratch("metadata_store_test");
  const std::string& dir = scratch.path();
  {
    auto store = MetadataStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put("job/a", "1").ok());
    ASSERT_TRUE((*store)->Put("job/b", "2").ok());
    ASSERT_TRUE((*store)->Put("kv/x", "3").ok());
    auto second = MetadataStore::Open(dir);
    EXPECT_FALSE(second.ok());  // the directory is locked by the first
  }
  auto store = MetadataStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto rows = (*store)->Scan("job/");
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].second, "2");
  ASSERT_TRUE((*store)->DeletePrefix("job/").ok());
  EXPECT_FALSE((*(*store)->Get("job/a")).has_value());
  EXPECT_EQ(*(*(*store)->Get("kv/x")), "3");
}

}  // namespace
}  // namespace strata
