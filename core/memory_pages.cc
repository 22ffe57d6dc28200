#include "core/memory_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace strata {

void AdviseHugePages(void* data, size_t num_bytes) {
  if (num_bytes > 0) madvise(data, num_bytes, MADV_HUGEPAGE);
}

void FaultInPages(void* data, size_t num_bytes) {
  auto* bytes = static_cast<char*>(data);
  for (size_t done = 0; done < num_bytes; done += kFaultInSliceBytes) {
    const size_t slice = std::min(kFaultInSliceBytes, num_bytes - done);
    if (madvise(bytes + done, slice, MADV_POPULATE_WRITE) != 0) {
      const size_t page_bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      for (size_t i = done; i < num_bytes; i += page_bytes)
        static_cast<volatile char*>(bytes)[i] = 0;
      return;
    }
  }
}

}  // namespace strata
