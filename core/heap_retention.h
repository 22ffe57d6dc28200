// Keeping the memory malloc frees for the allocations that follow, in a
// process that receives the same bytes every step. gRPC receives into
// 64 KiB blocks from malloc; once a push or a pull is consumed they are
// freed together, and glibc returns a heap's free top to the kernel as soon
// as it exceeds its trim threshold (128 KiB until a large block is freed),
// so the next step's receives fault every page in again, inside recvmsg
// (on a VM that returns freed pages to its host, at a fifth of memset's
// rate). Setting the thresholds keeps up to kHeapTrimThresholdBytes of free
// heap top and serves blocks up to kMmapThresholdBytes from the heap (the
// ceiling glibc's own adaptive threshold reaches): a process's memory then
// stays at the peak it reached instead of returning below it between steps.
// At most kMaxArenas arenas (glibc's default: 8 per core): each arena keeps
// its own peak, and a thread arena's 64 MiB heaps that empty entirely are
// unmapped whatever the threshold; the step bench's receives fault 108k
// pages in a run instead of 152k. An arena's lock is taken once per 64 KiB
// received.
//
// The shard server and strata-bench call it first thing; strata.launch
// passes the same settings to its workers as GLIBC_TUNABLES. A process that
// links the client library keeps its own allocator's settings.
//
// Thread-safety: call before the process starts its threads.
#ifndef STRATA_CORE_HEAP_RETENTION_H_
#define STRATA_CORE_HEAP_RETENTION_H_

#include <cstddef>

namespace strata {

inline constexpr size_t kHeapTrimThresholdBytes = size_t{1} << 30;
inline constexpr size_t kMmapThresholdBytes = size_t{32} << 20;
inline constexpr int kMaxArenas = 2;

// Sets glibc's trim and mmap thresholds and its arena limit (mallopt) as
// above; false where the allocator refuses them (another malloc: jemalloc,
// a sanitizer's).
bool RetainFreedHeapMemory();

}  // namespace strata

#endif  // STRATA_CORE_HEAP_RETENTION_H_
