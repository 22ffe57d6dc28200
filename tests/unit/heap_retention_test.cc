// RetainFreedHeapMemory (core/heap_retention.h): blocks of gRPC's receive
// size, allocated, written, freed together and allocated again, as a step's
// receives are: by default the second time faults their pages in again
// (the premise), once retained it faults almost none; and threads that
// allocate at once share at most kMaxArenas arenas.
#include "core/heap_retention.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
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

// The arenas malloc has made in this process (malloc_info's heaps).
int CountArenas() {
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  if (out == nullptr) return -1;
  malloc_info(0, out);
  std::fclose(out);
  int arenas = 0;
  for (const char* at = text; (at = std::strstr(at, "<heap nr=")) != nullptr; ++at) ++arenas;
  std::free(text);
  return arenas;
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

TEST(HeapRetentionTest, ThreadsAllocatingAtOnceShareTheArenas) {
  if (testing::kUnderAsan) GTEST_SKIP() << "ASan's allocator does not take mallopt's settings";
  ASSERT_TRUE(RetainFreedHeapMemory());
  constexpr int kThreads = 8;
  absl::BlockingCounter allocated(kThreads);
  absl::Notification counted;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      void* block = std::malloc(kBlockBytes);
      asm volatile("" : : "r"(block) : "memory");  // kept: the compiler may not drop it
      allocated.DecrementCount();
      counted.WaitForNotification();
      std::free(block);
    });
  }
  allocated.Wait();
  const int arenas = CountArenas();
  counted.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_GE(arenas, 1);
  EXPECT_LE(arenas, kMaxArenas);
}

}  // namespace
}  // namespace strata
