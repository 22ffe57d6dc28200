// AdviseHugePages and FaultInPages (core/memory_pages.h) on fresh anonymous
// mappings: every page resident after FaultInPages, and the advised range
// faulted in as transparent huge pages where the kernel gives them to those
// who ask (THP "always" or "madvise").
#include "core/memory_pages.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "testing/process_memory.h"

namespace strata {
namespace {

constexpr size_t kBytes = size_t{8} << 20;

// A fresh private anonymous mapping, unmapped on destruction.
class Mapping {
 public:
  explicit Mapping(size_t num_bytes)
      : num_bytes_(num_bytes),
        data_(
            mmap(nullptr, num_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {}
  ~Mapping() {
    if (data_ != MAP_FAILED) munmap(data_, num_bytes_);
  }
  void* data() const { return data_; }
  bool ok() const { return data_ != MAP_FAILED; }

 private:
  const size_t num_bytes_;
  void* const data_;
};

// AnonHugePages of the mapping that holds `address` (/proc/self/smaps), in bytes.
uint64_t HugePageBytesAt(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= at && at < end;
      continue;
    }
    uint64_t kib = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) {
      return kib * 1024;
    }
  }
  return 0;
}

// Whether the kernel gives huge pages to ranges advised MADV_HUGEPAGE.
bool HugePagesOnAdvice() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream text;
  text << enabled.rdbuf();
  return text.str().find("[always]") != std::string::npos ||
         text.str().find("[madvise]") != std::string::npos;
}

TEST(MemoryPagesTest, FaultInPagesMakesEveryPageResident) {
  Mapping mapping(kBytes);
  ASSERT_TRUE(mapping.ok());
  const size_t pages = kBytes / static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(testing::ResidentPages(mapping.data(), kBytes), 0u);
  FaultInPages(mapping.data(), kBytes);
  EXPECT_EQ(testing::ResidentPages(mapping.data(), kBytes), pages);
  EXPECT_EQ(static_cast<const char*>(mapping.data())[kBytes - 1], 0);
}

TEST(MemoryPagesTest, AnAdvisedRangeIsFaultedInAsHugePages) {
  if (!HugePagesOnAdvice()) GTEST_SKIP() << "transparent huge pages are off";
  Mapping mapping(kBytes);
  ASSERT_TRUE(mapping.ok());
  AdviseHugePages(mapping.data(), kBytes);
  FaultInPages(mapping.data(), kBytes);
  // The 2 MiB-aligned part of the range: 6 MiB of 8 at least.
  EXPECT_GE(HugePageBytesAt(mapping.data()), kBytes - (size_t{2} << 20));
}

// The calling thread's involuntary context switches so far (preemptions).
long InvoluntarySwitches() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nivcsw;
}

// Another thread of the process maps memory while a large range is being
// faulted in, not only once all of it is (one populate call holds the
// memory map lock, which mmap waits for): once the range's first page is in,
// the other thread maps, and its mmap must return well before the fault-in
// does -- within half of what was left of it. A try judges nothing where
// less than 20 ms of the fault-in was left when the thread asked, or where
// the thread was preempted around its mapping (a mapping that waits for the
// lock sleeps instead); the tries go on until 3 judged ones.
TEST(MemoryPagesTest, OtherThreadsMapMemoryWhileARangeIsFaultedIn) {
  using Clock = std::chrono::steady_clock;
  constexpr size_t kLarge = size_t{512} << 20;
  const size_t page_bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  int judged = 0;
  for (int attempt = 0; attempt < 20 && judged < 3; ++attempt) {
    Mapping mapping(kLarge);
    ASSERT_TRUE(mapping.ok());
    AdviseHugePages(mapping.data(), kLarge);
    Clock::time_point asked, mapped;
    bool preempted = false;
    std::thread other([&] {
      while (testing::ResidentPages(mapping.data(), page_bytes) == 0) {
      }
      const long switches = InvoluntarySwitches();
      asked = Clock::now();
      Mapping small(size_t{1} << 20);
      mapped = Clock::now();
      preempted = InvoluntarySwitches() != switches;
      EXPECT_TRUE(small.ok());
    });
    FaultInPages(mapping.data(), kLarge);
    const Clock::time_point faulted_in = Clock::now();
    other.join();
    const auto left = faulted_in - asked;
    if (preempted || left < std::chrono::milliseconds(20)) continue;
    ++judged;
    EXPECT_LT(mapped - asked, left / 2)
        << "the mapping waited for the fault-in: "
        << std::chrono::duration<double>(mapped - asked).count() << " s of the "
        << std::chrono::duration<double>(left).count() << " s it had left";
  }
  if (judged == 0) GTEST_SKIP() << "no try had the fault-in left to judge, unpreempted";
}

}  // namespace
}  // namespace strata
