// fio, the disk's limit for the strata-bench commands that do I/O: sequential
// direct I/O (io_uring engine) on a 2 GiB file in a directory. Stateless.
#ifndef STRATA_TOOLS_BENCH_FIO_H_
#define STRATA_TOOLS_BENCH_FIO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

// fio's bandwidth in GB/s for `rw` ("read" or "write") in `dir`, with
// `io_bytes` per I/O and `queue_depth` in flight, over 4 s. A read needs the
// file a write left (the caller removes dir/strata-fio.data when done).
// FAILED_PRECONDITION when fio fails or is missing.
absl::StatusOr<double> Fio(const std::string& dir, const std::string& rw, uint64_t io_bytes,
                           unsigned queue_depth);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_FIO_H_
