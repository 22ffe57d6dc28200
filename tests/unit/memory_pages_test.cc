// AdviseHugePages and FaultInPages (core/memory_pages.h) on fresh anonymous
// mappings: every page resident after FaultInPages, and the advised range
// faulted in as transparent huge pages where the kernel gives them to those
// who ask (THP "always" or "madvise").
#include "core/memory_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace
}  // namespace strata
