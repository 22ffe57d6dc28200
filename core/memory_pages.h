// Faulting in large anonymous memory ahead of its use: transparent huge
// pages where the kernel gives them (one fault and one page clear per 2 MiB
// instead of per 4 KiB), and every page faulted in at once. System calls
// on the caller's own memory: thread-safe for disjoint ranges.
#ifndef STRATA_CORE_MEMORY_PAGES_H_
#define STRATA_CORE_MEMORY_PAGES_H_

#include <cstddef>

namespace strata {

// Asks for transparent huge pages over [data, data + num_bytes), `data`
// page-aligned (MADV_HUGEPAGE): the 2 MiB-aligned ranges within it are then
// faulted in 2 MiB at a time. Nothing where the kernel refuses (THP off).
void AdviseHugePages(void* data, size_t num_bytes);

// Faults in every page of [data, data + num_bytes), `data` page-aligned,
// for writing: MADV_POPULATE_WRITE, or where the kernel predates it (Linux
// 5.14), a zero written to each page (the contents are the caller's to
// define). In slices of kFaultInSliceBytes, so that the process's other
// threads wait at most one slice: the kernel holds the process's memory
// map lock through a populate call, and every other thread's mmap, munmap
// and heap growth (gRPC's buffers) waits for it, and page faults behind
// those.
inline constexpr size_t kFaultInSliceBytes = size_t{4} << 20;
void FaultInPages(void* data, size_t num_bytes);

}  // namespace strata

#endif  // STRATA_CORE_MEMORY_PAGES_H_
