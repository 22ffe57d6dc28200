// The tier conformance suite on every tier, and what is particular to each:
// page-locking of the host tier; alignment, checksums and refusals of the
// NVMe tier; fault injection through FaultyTier.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/gpu_tier.h"
#include "storage/host_tier.h"
#include "storage/nvme_tier.h"
#include "testing/faulty_tier.h"
#include "testing/process_memory.h"
#include "testing/scratch_dir.h"
#include "tests/storage/tier_conformance.h"

namespace strata::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<NvmeTier> OpenNvme(uint64_t budget, const std::string& dir) {
  auto tier = NvmeTier::Open(NvmeTierOptions{dir, budget, 8});
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? *std::move(tier) : nullptr;
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, TierConformanceTest,
    ::testing::Values(
        TierFactory{"host", [](uint64_t budget,
                               const std::string&) { return std::make_unique<HostTier>(budget); }},
        TierFactory{"host_pinned",
                    [](uint64_t budget, const std::string&) -> std::unique_ptr<Tier> {
                      // Page-locking needs a memlock limit above the budget.
                      if (MemlockLimitBytes() < budget) return nullptr;
                      return std::make_unique<HostTier>(budget, HostTier::Pinning::kMlock);
                    }},
        TierFactory{"host_pinned_for_gpu",
                    [](uint64_t budget, const std::string&) -> std::unique_ptr<Tier> {
                      if (GpuCount() == 0) return nullptr;
                      return std::make_unique<HostTier>(budget, HostTier::Pinning::kGpu);
                    }},
        TierFactory{"nvme",
                    [](uint64_t budget, const std::string& dir) -> std::unique_ptr<Tier> {
                      return OpenNvme(budget, dir);
                    }},
        // GPU 0, where there is one.
        TierFactory{"gpu",
                    [](uint64_t budget, const std::string&) -> std::unique_ptr<Tier> {
                      if (GpuCount() == 0) return nullptr;
                      auto tier = OpenGpuTier(0, budget);
                      EXPECT_TRUE(tier.ok()) << tier.status();
                      return tier.ok() ? *std::move(tier) : nullptr;
                    }},
        // One block per submission and two in flight: ops split into parts
        // that wait for room in the ring.
        TierFactory{"nvme_small_io",
                    [](uint64_t budget, const std::string& dir) -> std::unique_ptr<Tier> {
                      auto tier = NvmeTier::Open(NvmeTierOptions{dir, budget, 2, kBlock});
                      EXPECT_TRUE(tier.ok()) << tier.status();
                      return tier.ok() ? *std::move(tier) : nullptr;
                    }}),
    [](const auto& info) { return info.param.name; });

// The memlock limit that refuses page-locks beyond it here, or 0 where none
// does: root, no limit, or ASan (whose mlock locks nothing).
uint64_t RefusingMemlockLimit() {
  const uint64_t limit = MemlockLimitBytes();
  return kUnderAsan || limit == std::numeric_limits<uint64_t>::max() ? 0 : limit;
}

TEST(HostTierTest, RefusedPageLockNamesTheMemlockLimit) {
  const uint64_t limit = RefusingMemlockLimit();
  if (limit == 0) GTEST_SKIP() << "nothing refuses a page-lock here (root, no limit or ASan)";
  HostTier tier(limit * 4, HostTier::Pinning::kMlock);
  auto extent = tier.Allocate(limit * 2);
  EXPECT_EQ(extent.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(extent.status().message()), HasSubstr("ulimit -l"));
  EXPECT_EQ(tier.used_bytes(), 0u);
  const absl::Status prefaulted = tier.Prefault(limit * 2);
  EXPECT_EQ(prefaulted.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(prefaulted.message()), HasSubstr("ulimit -l"));
  EXPECT_EQ(tier.used_bytes() + tier.kept_bytes(), 0u);
}

// A page-aligned extent is faulted in when allocated; one to fill, by the
// writes that fill it (unpinned, a page they leave out is faulted in when
// first touched). Counted in base pages: khugepaged could otherwise collapse
// the two extents, merged into one mapping, into a huge page.
TEST(HostTierTest, AnExtentToFillIsFaultedInByItsWrites) {
  constexpr uint64_t kExtentBytes = uint64_t{1} << 20;
  NoTransparentHugePages base_pages_only;
  HostTier tier(2 * kExtentBytes);
  auto allocated = tier.Allocate(kExtentBytes);
  auto to_fill = tier.AllocateToFill(kExtentBytes);
  ASSERT_TRUE(allocated.ok() && to_fill.ok());
  EXPECT_EQ(ResidentPages(tier.Map(*allocated), kExtentBytes), kExtentBytes / kBlock);
  EXPECT_EQ(ResidentPages(tier.Map(*to_fill), kExtentBytes), 0u);
  AlignedBuffer written(16 * kBlock);
  written.Fill(5);
  ASSERT_TRUE(WriteAndWait(tier, *to_fill, 0, written.span()).ok());
  ASSERT_TRUE(tier.Settle(*to_fill).ok());
  EXPECT_EQ(ResidentPages(tier.Map(*to_fill), kExtentBytes), 16u);
}

// An extent to fill is left to the writes that fill it, page-locked only
// once settled; freed, its memory stays locked for the next extent of its
// size, as any pinned extent's, and is unlocked when the tier goes.
TEST(HostTierTest, AnExtentToFillIsPageLockedWhenSettled) {
  constexpr uint64_t kExtentBytes = uint64_t{1} << 20;
  if (kUnderAsan) GTEST_SKIP() << "ASan's mlock locks nothing";
  if (MemlockLimitBytes() < 4 * kExtentBytes) GTEST_SKIP() << "memlock limit below 4 MiB";
  HostTier tier(4 * kExtentBytes, HostTier::Pinning::kMlock);
  const uint64_t before = LockedBytes();
  auto to_fill = tier.AllocateToFill(kExtentBytes);
  ASSERT_TRUE(to_fill.ok()) << to_fill.status();
  EXPECT_EQ(LockedBytes(), before) << "locked before it was filled";
  auto pinned = tier.Allocate(kExtentBytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(LockedBytes(), before + kExtentBytes);
  ASSERT_TRUE(tier.Settle(*to_fill).ok());
  EXPECT_EQ(LockedBytes(), before + 2 * kExtentBytes);
  tier.Free(*to_fill);
  EXPECT_EQ(LockedBytes(), before + 2 * kExtentBytes);
  EXPECT_EQ(tier.Settle(*to_fill).code(), absl::StatusCode::kNotFound);
  auto again = tier.AllocateToFill(kExtentBytes);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(LockedBytes(), before + 2 * kExtentBytes) << "locked again, not reused";
  ASSERT_TRUE(tier.Settle(*again).ok());
  {
    HostTier gone(kExtentBytes, HostTier::Pinning::kMlock);
    auto freed = gone.Allocate(kExtentBytes);
    ASSERT_TRUE(freed.ok()) << freed.status();
    gone.Free(*freed);
    EXPECT_EQ(LockedBytes(), before + 3 * kExtentBytes);
  }
  EXPECT_EQ(LockedBytes(), before + 2 * kExtentBytes);
}

// A freed page-aligned extent's memory makes the next extent of its size,
// zeroed (to fill too), in place of new memory; it stays within the budget
// with the extents and goes when a new extent needs the room. Small
// extents are not kept.
TEST(HostTierTest, AFreedExtentsMemoryMakesTheNextOfItsSizeZeroed) {
  constexpr uint64_t kExtentBytes = uint64_t{1} << 20;
  HostTier tier(3 * kExtentBytes);
  for (bool to_fill : {false, true}) {
    auto first = tier.Allocate(kExtentBytes);
    ASSERT_TRUE(first.ok()) << first.status();
    std::byte* memory = tier.Map(*first);
    std::memset(memory, 0x5a, kExtentBytes);
    tier.Free(*first);
    EXPECT_EQ(tier.used_bytes(), 0u);
    EXPECT_EQ(tier.kept_bytes(), kExtentBytes);
    auto next = to_fill ? tier.AllocateToFill(kExtentBytes) : tier.Allocate(kExtentBytes);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(tier.Map(*next), memory);
    EXPECT_EQ(tier.kept_bytes(), 0u);
    AlignedBuffer read(kExtentBytes);
    ASSERT_TRUE(ReadAndWait(tier, *next, 0, read.span()).ok());
    EXPECT_EQ(std::count(read.span().begin(), read.span().end(), std::byte{0}), kExtentBytes)
        << (to_fill ? "to fill" : "allocated");
    tier.Free(*next);
  }
  // Another size: made anew beside the kept extent while the budget has room
  // for both, then in its room.
  auto two = tier.Allocate(2 * kExtentBytes);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(tier.kept_bytes(), kExtentBytes);
  tier.Free(*two);
  EXPECT_EQ(tier.kept_bytes(), 3 * kExtentBytes);
  auto three = tier.Allocate(3 * kExtentBytes);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(tier.used_bytes(), 3 * kExtentBytes);
  EXPECT_EQ(tier.kept_bytes(), 0u);
  tier.Free(*three);
  // 64-byte-aligned extents are not kept.
  HostTier small_tier(HostTier::kPageAlignedFromBytes);
  auto small = small_tier.Allocate(HostTier::kPageAlignedFromBytes / 2);
  ASSERT_TRUE(small.ok()) << small.status();
  small_tier.Free(*small);
  EXPECT_EQ(small_tier.kept_bytes(), 0u);
}

// Kept locked memory that leaves a new extent no room under the memlock
// limit is released for it.
TEST(HostTierTest, KeptMemoryMakesRoomUnderTheMemlockLimit) {
  const uint64_t limit = RefusingMemlockLimit();
  if (limit == 0) GTEST_SKIP() << "nothing refuses a page-lock here (root, no limit or ASan)";
  const uint64_t pages = limit / kBlock;
  HostTier tier(limit * 4, HostTier::Pinning::kMlock);
  auto half = tier.Allocate(pages / 2 * kBlock);
  ASSERT_TRUE(half.ok()) << half.status();
  tier.Free(*half);
  EXPECT_GT(tier.kept_bytes(), 0u);
  auto most = tier.Allocate(pages * 3 / 4 * kBlock);  // larger than any kept block
  ASSERT_TRUE(most.ok()) << most.status();
  EXPECT_EQ(tier.kept_bytes(), 0u);
}

// Prefaulted memory makes page-aligned extents of any size, each the front
// of the smallest kept block that holds it: already faulted in (to fill
// too), zeroed where it was written, within the budget.
TEST(HostTierTest, PrefaultedMemoryMakesExtentsOfAnySize) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  NoTransparentHugePages base_pages_only;
  HostTier tier(8 * kMiB);
  ASSERT_TRUE(tier.Prefault(6 * kMiB).ok());
  EXPECT_EQ(tier.kept_bytes(), 6 * kMiB);
  EXPECT_EQ(tier.used_bytes(), 0u);
  auto one = tier.Allocate(kMiB);
  auto to_fill = tier.AllocateToFill(2 * kMiB);
  auto odd = tier.Allocate(HostTier::kPageAlignedFromBytes + 1);
  ASSERT_TRUE(one.ok() && to_fill.ok() && odd.ok());
  EXPECT_EQ(tier.Map(*to_fill), tier.Map(*one) + kMiB) << "not cut from the prefaulted memory";
  EXPECT_EQ(ResidentPages(tier.Map(*to_fill), 2 * kMiB), 2 * kMiB / kBlock);
  const uint64_t odd_bytes = HostTier::kPageAlignedFromBytes + kBlock;
  EXPECT_EQ(tier.used_bytes(), 3 * kMiB + odd_bytes);
  EXPECT_EQ(tier.kept_bytes(), 3 * kMiB - odd_bytes);
  for (const Extent& e : {*one, *to_fill, *odd}) {
    std::vector<std::byte> read(e.num_bytes, std::byte{7});
    ASSERT_TRUE(ReadAndWait(tier, e, 0, absl::MakeSpan(read)).ok());
    EXPECT_EQ(std::count(read.begin(), read.end(), std::byte{0}), e.num_bytes);
  }
  // A written extent's memory, freed, makes a smaller one, zeroed.
  std::memset(tier.Map(*one), 0x5a, kMiB);
  tier.Free(*one);
  auto half = tier.Allocate(kMiB / 2);
  ASSERT_TRUE(half.ok()) << half.status();
  std::byte* memory = tier.Map(*half);
  EXPECT_EQ(std::count(memory, memory + kMiB / 2, std::byte{0}), kMiB / 2);
  EXPECT_EQ(tier.used_bytes() + tier.kept_bytes(), 6 * kMiB);
}

// Prefaulting counts against the budget with what the tier holds and
// keeps; a new extent that needs room takes only what it needs of the
// kept memory.
TEST(HostTierTest, PrefaultStaysWithinTheBudgetAndGivesWayAsNeeded) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  HostTier tier(4 * kMiB);
  const absl::Status beyond = tier.Prefault(4 * kMiB + 1);
  EXPECT_EQ(beyond.code(), absl::StatusCode::kResourceExhausted) << beyond;
  EXPECT_EQ(tier.kept_bytes(), 0u);
  ASSERT_TRUE(tier.Prefault(3 * kMiB).ok());
  EXPECT_EQ(tier.Prefault(kMiB + kBlock).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(tier.Prefault(kMiB).ok());
  EXPECT_EQ(tier.kept_bytes(), 4 * kMiB);
  auto small = tier.Allocate(1000);  // 64-byte-aligned: new memory, a page of the kept goes
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(tier.used_bytes(), 1024u);
  EXPECT_EQ(tier.kept_bytes(), 4 * kMiB - kBlock);
  auto rest = tier.Allocate(4 * kMiB - kBlock);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(tier.kept_bytes(), 0u);
  EXPECT_EQ(tier.Allocate(kBlock).status().code(), absl::StatusCode::kResourceExhausted);
}

// Prefaulted memory is page-locked at once and lends its lock to the
// extents it makes; the tier unlocks it when it goes.
TEST(HostTierTest, PrefaultedMemoryIsPageLocked) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (kUnderAsan) GTEST_SKIP() << "ASan's mlock locks nothing";
  if (MemlockLimitBytes() < 8 * kMiB) GTEST_SKIP() << "memlock limit below 8 MiB";
  const uint64_t before = LockedBytes();
  {
    HostTier tier(4 * kMiB, HostTier::Pinning::kMlock);
    ASSERT_TRUE(tier.Prefault(4 * kMiB).ok());
    EXPECT_EQ(LockedBytes(), before + 4 * kMiB);
    auto one = tier.Allocate(kMiB);
    auto to_fill = tier.AllocateToFill(kMiB);
    ASSERT_TRUE(one.ok() && to_fill.ok());
    ASSERT_TRUE(tier.Settle(*to_fill).ok());
    EXPECT_EQ(LockedBytes(), before + 4 * kMiB);
    tier.Free(*one);
    EXPECT_EQ(LockedBytes(), before + 4 * kMiB);
  }
  EXPECT_EQ(LockedBytes(), before);
}

// A page-lock refused when the extent is settled names the memlock limit
// and leaves the extent as it was: held, readable, freeable.
TEST(HostTierTest, RefusedPageLockOfAFilledExtentNamesTheMemlockLimit) {
  const uint64_t limit = RefusingMemlockLimit();
  if (limit == 0) GTEST_SKIP() << "nothing refuses a page-lock here (root, no limit or ASan)";
  HostTier tier(limit * 4, HostTier::Pinning::kMlock);
  auto extent = tier.AllocateToFill(limit * 2);
  ASSERT_TRUE(extent.ok()) << extent.status();
  const absl::Status settled = tier.Settle(*extent);
  EXPECT_EQ(settled.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(settled.message()), HasSubstr("ulimit -l"));
  EXPECT_EQ(tier.used_bytes(), limit * 2);
  std::vector<std::byte> back(kBlock, std::byte{1});
  ASSERT_TRUE(ReadAndWait(tier, *extent, 0, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, std::vector<std::byte>(kBlock));
  tier.Free(*extent);
  EXPECT_EQ(tier.used_bytes(), 0u);
}

TEST(GpuTierTest, RefusesAMissingGpuAndABudgetBeyondItsMemory) {
  auto missing = OpenGpuTier(GpuCount(), kBlock);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("GPU"));
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  auto huge = OpenGpuTier(0, uint64_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("free on GPU 0"));
}

// Extents start as zeros in device memory that the tier's DeviceAddress
// names, so that kernels work on them in place; they are not host memory.
TEST(GpuTierTest, ExtentsAreZeroedDeviceMemory) {
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  auto tier = OpenGpuTier(0, 64 * kBlock);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_EQ((*tier)->kind(), TierKind::kGpu);
  auto e = (*tier)->Allocate(3 * kBlock + 5);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*tier)->Map(*e), nullptr);
  EXPECT_NE((*tier)->DeviceAddress(*e), nullptr);
  std::vector<std::byte> back(3 * kBlock + 5, std::byte{0xff});
  ASSERT_TRUE(ReadAndWait(**tier, *e, 0, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, std::vector<std::byte>(back.size()));
  (*tier)->Free(*e);
  EXPECT_EQ((*tier)->DeviceAddress(*e), nullptr);
}

// CUDA refuses to register a page twice: tiny extents each take pages of
// their own.
TEST(HostTierTest, PinnedForTheGpuTinyExtentsEachRegister) {
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  HostTier tier(1 << 20, HostTier::Pinning::kGpu);
  std::vector<Extent> extents;
  for (int i = 0; i < 64; ++i) {
    auto e = tier.Allocate(100);
    ASSERT_TRUE(e.ok()) << i << ": " << e.status();
    extents.push_back(*e);
  }
  EXPECT_EQ(tier.used_bytes(), 64 * kBlock);
  for (const Extent& e : extents) tier.Free(e);
  EXPECT_EQ(tier.used_bytes(), 0u);
}

// Pinned for the GPU, prefaulted memory is registered extent by extent; a
// freed extent's registered memory makes only an extent of its own size
// (CUDA unregisters a registration whole), never the front of a smaller one.
TEST(HostTierTest, PinnedForTheGpuPrefaultedMemoryIsRegisteredByEachExtent) {
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  HostTier tier(4 * kMiB, HostTier::Pinning::kGpu);
  ASSERT_TRUE(tier.Prefault(4 * kMiB).ok());
  auto first = tier.Allocate(kMiB);
  auto to_fill = tier.AllocateToFill(kMiB);
  ASSERT_TRUE(first.ok() && to_fill.ok());
  ASSERT_TRUE(tier.Settle(*to_fill).ok());
  std::byte* freed = tier.Map(*first);
  tier.Free(*first);
  auto half = tier.Allocate(kMiB / 2);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_NE(tier.Map(*half), freed) << "cut from a registered extent";
  auto whole = tier.Allocate(kMiB);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(tier.Map(*whole), freed);
  for (const Extent& e : {*to_fill, *half, *whole}) tier.Free(e);
  EXPECT_EQ(tier.used_bytes(), 0u);
}

class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tier_ = OpenNvme(64 * kBlock, scratch_.path());
    ASSERT_NE(tier_, nullptr);
  }
  const ScratchDir scratch_{"tier_test_nvme"};
  std::unique_ptr<NvmeTier> tier_;
};

TEST_F(NvmeTierTest, DetectsCorruptionOnDiskAsDataLoss) {
  auto e = tier_->Allocate(4 * kBlock);
  ASSERT_TRUE(e.ok());
  AlignedBuffer in(4 * kBlock), out(4 * kBlock);
  in.Fill(7);
  ASSERT_TRUE(WriteAndWait(*tier_, *e, 0, in.span()).ok());
  // Flip one byte of block 2 behind the tier's back.
  int fd = open(tier_->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  off_t at = static_cast<off_t>(e->offset + 2 * kBlock + 100);
  ASSERT_EQ(pread(fd, &byte, 1, at), 1);
  byte ^= 0x01;
  ASSERT_EQ(pwrite(fd, &byte, 1, at), 1);
  fsync(fd);
  close(fd);
  absl::Status s = ReadAndWait(*tier_, *e, 0, out.span());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(tier_->path()));
  EXPECT_THAT(std::string(s.message()), HasSubstr("block 2"));
  // Blocks that are intact still read.
  AlignedBuffer first(kBlock);
  EXPECT_TRUE(ReadAndWait(*tier_, *e, 0, first.span()).ok());
}

// Read in pieces of one block each, from the extent's second block on: the
// mismatch still names its block and byte within the extent and the file.
TEST(NvmeTierPiecesTest, AMismatchNamesItsBlockWhateverTheReadsOffsetAndPieces) {
  const ScratchDir scratch("tier_test_nvme_pieces");
  absl::StatusOr<std::unique_ptr<NvmeTier>> tier =
      NvmeTier::Open(NvmeTierOptions{scratch.path(), 64 * kBlock, 8, kBlock});
  ASSERT_TRUE(tier.ok()) << tier.status();
  ASSERT_TRUE((*tier)->Allocate(3 * kBlock).ok());  // the extent under test starts past block 0
  auto e = (*tier)->Allocate(5 * kBlock);
  ASSERT_TRUE(e.ok());
  AlignedBuffer in(5 * kBlock), out(4 * kBlock);
  in.Fill(9);
  ASSERT_TRUE(WriteAndWait(**tier, *e, 0, in.span()).ok());
  const uint64_t corrupt = e->offset + 3 * kBlock;
  int fd = open((*tier)->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(corrupt + 7)), 1);
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(corrupt + 7)), 1);
  fsync(fd);
  close(fd);
  absl::Status s = ReadAndWait(**tier, *e, kBlock, out.span());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("at byte ", corrupt, " ")));
  EXPECT_THAT(std::string(s.message()), HasSubstr("block 3)"));
  // The blocks around it read.
  EXPECT_TRUE(ReadAndWait(**tier, *e, kBlock, out.span().subspan(0, 2 * kBlock)).ok());
  EXPECT_TRUE(ReadAndWait(**tier, *e, 4 * kBlock, out.span().subspan(0, kBlock)).ok());
}

TEST_F(NvmeTierTest, RefusesMisalignedAndUnwritten) {
  auto e = tier_->Allocate(2 * kBlock);
  ASSERT_TRUE(e.ok());
  AlignedBuffer buffer(3 * kBlock);
  EXPECT_EQ(ReadAndWait(*tier_, *e, 0, buffer.span()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReadAndWait(*tier_, *e, 0, buffer.span().subspan(0, kBlock)).code(),
            absl::StatusCode::kFailedPrecondition);  // never written
  EXPECT_EQ(WriteAndWait(*tier_, *e, 100, buffer.span().subspan(0, kBlock)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteAndWait(*tier_, *e, 0, buffer.span().subspan(8, kBlock)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NvmeTierTest, FixedBuffersRoundTrip) {
  AlignedBuffer registered(8 * kBlock);
  ASSERT_TRUE(tier_->RegisterBuffers({registered.span()}).ok());
  auto e = tier_->Allocate(4 * kBlock);
  ASSERT_TRUE(e.ok());
  registered.Fill(9);
  AlignedBuffer expected(4 * kBlock);
  std::memcpy(expected.span().data(), registered.span().data(), 4 * kBlock);
  ASSERT_TRUE(WriteAndWait(*tier_, *e, 0, registered.span().subspan(0, 4 * kBlock)).ok());
  ASSERT_TRUE(ReadAndWait(*tier_, *e, 0, registered.span().subspan(4 * kBlock, 4 * kBlock)).ok());
  EXPECT_EQ(std::memcmp(registered.span().data() + 4 * kBlock, expected.span().data(), 4 * kBlock),
            0);
}

// Extents of mixed sizes (a job's chunks and its shorter last chunk) leave
// holes of both sizes; a new extent takes the hole that fits it best, so a
// larger one still finds room (first fit would have cut the large hole for
// the small extent), and a refusal when no hole holds an extent says so
// rather than blaming the budget.
TEST_F(NvmeTierTest, ExtentsTakeTheHoleThatFitsThemBest) {
  auto large = tier_->Allocate(40 * kBlock);
  auto between = tier_->Allocate(4 * kBlock);
  auto small = tier_->Allocate(12 * kBlock);
  auto rest = tier_->Allocate(8 * kBlock);
  for (const auto* e : {&large, &between, &small, &rest}) ASSERT_TRUE(e->ok()) << e->status();
  tier_->Free(*large);
  tier_->Free(*small);

  absl::Status refused = tier_->Allocate(50 * kBlock).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(absl::StrCat("largest free range is ", 40 * kBlock, " of ", 52 * kBlock,
                                     " free bytes")));

  auto small_again = tier_->Allocate(12 * kBlock);
  ASSERT_TRUE(small_again.ok()) << small_again.status();
  EXPECT_EQ(small_again->offset, small->offset);
  auto large_again = tier_->Allocate(40 * kBlock);
  ASSERT_TRUE(large_again.ok()) << large_again.status();
  EXPECT_EQ(large_again->offset, large->offset);
  EXPECT_EQ(tier_->used_bytes(), 64 * kBlock);
}

TEST(NvmeTierReopenTest, AdoptedExtentsReadBackAfterAReopen) {
  const ScratchDir scratch("tier_test_reopen");
  const std::string& dir = scratch.path();
  AlignedBuffer in(3 * kBlock), out(3 * kBlock);
  in.Fill(11);
  uint64_t offset = 0;
  std::vector<uint64_t> checksums;
  {
    auto tier = OpenNvme(32 * kBlock, dir);
    ASSERT_NE(tier, nullptr);
    ASSERT_TRUE(tier->Allocate(kBlock).ok());  // so the extent is not the first
    auto e = tier->Allocate(3 * kBlock);
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE(WriteAndWait(*tier, *e, 0, in.span()).ok());
    offset = e->offset;
    auto sums = tier->Checksums(*e);
    ASSERT_TRUE(sums.ok()) << sums.status();
    checksums = *sums;
  }
  auto tier = OpenNvme(32 * kBlock, dir);  // reopening keeps the file's contents
  ASSERT_NE(tier, nullptr);
  auto adopted = tier->Adopt(offset, 3 * kBlock, checksums);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_TRUE(ReadAndWait(*tier, *adopted, 0, out.span()).ok());
  EXPECT_TRUE(in == out);
  EXPECT_EQ(tier->Adopt(offset + kBlock, kBlock, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // taken
  // New extents do not overlap the adopted one.
  auto fresh = tier->Allocate(8 * kBlock);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->offset + 8 * kBlock <= offset || fresh->offset >= offset + 3 * kBlock);
}

// Adoptions whose end wraps past 2^64 or whose size wraps when rounded
// (found by nvme_extent_fuzz): refused, and the free space stays whole (they
// once took a free range they did not lie in).
TEST(NvmeTierReopenTest, AdoptionsThatWrapAreRefusedAndTakeNothing) {
  const ScratchDir scratch("tier_test_adopt_wrap");
  auto tier = OpenNvme(32 * kBlock, scratch.path());
  ASSERT_NE(tier, nullptr);
  const uint64_t used = tier->used_bytes();
  const std::pair<uint64_t, uint64_t> cases[] = {
      {~uint64_t{0} - kBlock + 1, 2 * kBlock},  // the end wraps
      {kBlock, ~uint64_t{0}},                   // the size wraps when rounded
      {kBlock, ~uint64_t{0} - kBlock + 2},
      {kBlock, 0},
  };
  for (const auto& [offset, num_bytes] : cases) {
    EXPECT_FALSE(tier->Adopt(offset, num_bytes, {}).ok()) << offset << " " << num_bytes;
  }
  EXPECT_EQ(tier->used_bytes(), used);
  auto whole = tier->Allocate(32 * kBlock - used);
  EXPECT_TRUE(whole.ok()) << whole.status();
}

TEST(NvmeTierOpenTest, RefusesAFileSystemWithoutODirect) {
  if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no tmpfs at /dev/shm";
  std::string dir = "/dev/shm/strata_tier_test_" + std::to_string(getpid());
  auto tier = NvmeTier::Open(NvmeTierOptions{dir, 16 * kBlock, 8});
  std::filesystem::remove_all(dir);
  if (tier.ok()) GTEST_SKIP() << "this tmpfs accepts O_DIRECT";
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tier.status().message()), HasSubstr("O_DIRECT"));
}

TEST(FaultyTierTest, AFailedWriteLeavesThePreviousContents) {
  const ScratchDir scratch("tier_test_faulty");
  const std::string& dir = scratch.path();
  auto nvme = OpenNvme(16 * kBlock, dir);
  ASSERT_NE(nvme, nullptr);
  FaultyTier tier(nvme.get());
  auto e = tier.Allocate(2 * kBlock);
  ASSERT_TRUE(e.ok());
  AlignedBuffer first(2 * kBlock), second(2 * kBlock), out(2 * kBlock);
  first.Fill(1);
  second.Fill(2);
  ASSERT_TRUE(WriteAndWait(tier, *e, 0, first.span()).ok());
  tier.FailNextWrites(1);
  EXPECT_EQ(WriteAndWait(tier, *e, 0, second.span()).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(ReadAndWait(tier, *e, 0, out.span()).ok());
  EXPECT_TRUE(out == first);
  tier.ShortenNextReads(1);
  EXPECT_EQ(ReadAndWait(tier, *e, 0, out.span()).code(), absl::StatusCode::kDataLoss);
  tier.FailNextReads(1);
  EXPECT_EQ(ReadAndWait(tier, *e, 0, out.span()).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(WriteAndWait(tier, *e, 0, second.span()).ok());  // a retry succeeds
  ASSERT_TRUE(ReadAndWait(tier, *e, 0, out.span()).ok());
  EXPECT_TRUE(out == second);
  tier.SetFull(true);
  EXPECT_EQ(tier.Allocate(kBlock).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::testing
