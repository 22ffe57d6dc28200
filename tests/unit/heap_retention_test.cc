// RetainFreedHeapMemory (core/heap_retention.h): blocks of gRPC's receive
// size, allocated, written, freed together and allocated again, as a step's
// receives are: by default the second time faults their pages in again
// (the premise), once retained it faults almost none.
#include "core/heap_retention.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/process_memory.h"

namespace strata {
namespace {

constexpr size_t kBlockBytes = 64 << 10;
constexpr int kBlocks = 256;  // 16 MiB

// Minor page faults of the calling thread so far.
long ThreadMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// Allocates kBlocks blocks, writes a byte to each of their pages, frees them.
void WriteAndFreeBlocks() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<char*> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    char* block = static_cast<char*>(std::malloc(kBlockBytes));
    ASSERT_NE(block, nullptr);
    for (size_t at = 0; at < kBlockBytes; at += page) block[at] = 1;
    // The writes are observable: the compiler may not drop the blocks.
    asm volatile("" : : "r"(block) : "memory");
    blocks.push_back(block);
  }
  for (char* block : blocks) std::free(block);
}

// The page faults of the second of two rounds of WriteAndFreeBlocks on a
// thread of its own (a thread arena, as gRPC's receiving threads use).
long FaultsOfSecondRound() {
  long faults = 0;
  std::thread([&] {
    WriteAndFreeBlocks();
    const long before = ThreadMinorFaults();
    WriteAndFreeBlocks();
    faults = ThreadMinorFaults() - before;
  }).join();
  return faults;
}

TEST(HeapRetentionTest, FreedBlocksAreWrittenAgainWithoutFaults) {
  if (testing::kUnderAsan) GTEST_SKIP() << "ASan's allocator does not take mallopt's settings";
  const long pages = static_cast<long>(kBlocks * kBlockBytes / sysconf(_SC_PAGESIZE));
  const long trimmed = FaultsOfSecondRound();
  EXPECT_GE(trimmed, pages / 2) << "glibc's default thresholds kept the freed memory";
  ASSERT_TRUE(RetainFreedHeapMemory());
  const long retained = FaultsOfSecondRound();
  std::printf("second round's faults of %ld pages: %ld by default, %ld retained\n", pages, trimmed,
              retained);
  EXPECT_LE(retained, pages / 32) << "of " << pages << " pages; " << trimmed << " by default";
}

}  // namespace
}  // namespace strata
