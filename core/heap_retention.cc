#include "core/heap_retention.h"

#include <malloc.h>

namespace strata {

bool RetainFreedHeapMemory() {
  // mallopt answers 1 where it took the value.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapTrimThresholdBytes)) == 1;
  const bool arenas_set = mallopt(M_ARENA_MAX, kMaxArenas) == 1;
  return mmap_set && trim_set && arenas_set;
}

}  // namespace strata
