// ParallelFor(): work items [0, n) taken in order by a few threads, stopping
// at the first error. For the shard server's checkpoint I/O: one file's
// checksum and copies overlap another's reads or writes, so the disk does
// not wait for the CPU.
//
// Thread-safe: `work` and `skipped` are called concurrently from up to
// `threads` threads (the caller's one of them) and must be thread-safe
// themselves; ParallelFor returns after every call ended.
#ifndef STRATA_CORE_PARALLEL_FOR_H_
#define STRATA_CORE_PARALLEL_FOR_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace strata {

// Calls work(thread, i) for each i in [0, n) in increasing order of start,
// `thread` in [0, threads) naming the calling thread (for per-thread
// buffers). After the first error, skipped(i) is called for the items not
// yet started instead, and that error is returned.
absl::Status ParallelFor(
    size_t n, size_t threads, absl::FunctionRef<absl::Status(size_t thread, size_t i)> work,
    absl::FunctionRef<void(size_t i)> skipped = [](size_t) {});

}  // namespace strata

#endif  // STRATA_CORE_PARALLEL_FOR_H_
