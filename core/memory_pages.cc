#include "core/memory_pages.h"

#include <sys/mman.h>
#include <unistd.h>

namespace strata {

void AdviseHugePages(void* data, size_t num_bytes) {
  if (num_bytes > 0) madvise(data, num_bytes, MADV_HUGEPAGE);
}

void FaultInPages(void* data, size_t num_bytes) {
  if (num_bytes == 0 || madvise(data, num_bytes, MADV_POPULATE_WRITE) == 0) return;
  const size_t page_bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < num_bytes; i += page_bytes) static_cast<volatile char*>(data)[i] = 0;
}

}  // namespace strata
