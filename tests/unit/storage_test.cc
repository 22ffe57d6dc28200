#include <signal.h>
#include <sys/resource.h>

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

// A write that fails (a file-size limit of 0 on this process: EFBIG, as on a
// full disk) leaves RocksDB refusing writes after the storage takes them
// again; Reopen() serves again, with every write made before the failure.
TEST(MetadataStoreTest, AStoreReopenedAfterAFailedWriteServesAgain) {
  const testing::ScratchDir scratch("metadata_store_reopen");
  auto store = MetadataStore::Open(scratch.path());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put("kept", "1", /*sync=*/true).ok());
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &previous), 0);
  struct rlimit unlimited {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &unlimited), 0);
  struct rlimit full = unlimited;
  full.rlim_cur = 0;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &full), 0);
  absl::Status failed = (*store)->Put("lost", std::string(8192, 'x'), /*sync=*/true);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &unlimited), 0);
  ASSERT_EQ(sigaction(SIGXFSZ, &previous, nullptr), 0);
  EXPECT_FALSE(failed.ok());
  EXPECT_FALSE((*store)->Put("after", "2", /*sync=*/true).ok()) << "RocksDB's sticky error";
  ASSERT_TRUE((*store)->Reopen().ok());
  EXPECT_TRUE((*store)->Put("after", "2", /*sync=*/true).ok());
  EXPECT_EQ((*store)->Get("kept")->value_or(""), "1");
  EXPECT_EQ((*store)->Get("after")->value_or(""), "2");
}

}  // namespace
}  // namespace strata
