// fio, the disk's limit for the strata-bench commands that do I/O: direct
// I/O (io_uring engine) on a file in a directory, sequential reads or
// writes, or both at once as the NVMe tier does them. Stateless.
#ifndef STRATA_TOOLS_BENCH_FIO_H_
#define STRATA_TOOLS_BENCH_FIO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

// fio's bandwidth in GB/s for `rw` ("read" or "write") in `dir`, on a file
// of `file_bytes`, with `io_bytes` per I/O and `queue_depth` in flight, over
// 4 s. A read needs the file a write left (the caller removes it with
// RemoveFioFiles() when done).
// FAILED_PRECONDITION when fio fails or is missing.
absl::StatusOr<double> Fio(const std::string& dir, const std::string& rw, uint64_t file_bytes,
                           uint64_t io_bytes, unsigned queue_depth);

// fio's bandwidth in GB/s for one pass of `rw` ("read" or "write") over
// `bytes` in `files` files written or read at once (a share of
// `queue_depth` in flight on each): the limit of a transfer of that size (a
// write counts until fsync returns), which a short burst on a disk that
// throttles sustained I/O would beat if measured over a longer run. A write
// into missing files makes them as a save makes its files, with no space
// allocated ahead; one into existing files overwrites their blocks. A read
// needs the files a write of as many files left. INVALID_ARGUMENT for no
// files.
absl::StatusOr<double> FioOnce(const std::string& dir, const std::string& rw, uint64_t bytes,
                               uint64_t io_bytes, unsigned queue_depth, unsigned files);

// Removes every file the functions above left in `dir`.
void RemoveFioFiles(const std::string& dir);

// Reads and writes at once, half each, on the file a write left: the read
// and the write bandwidth in GB/s, writes durable when they complete
// (O_DSYNC, as the NVMe tier's RWF_DSYNC writes).
struct FioMixed {
  double read_GBps = 0;
  double write_GBps = 0;
};
absl::StatusOr<FioMixed> FioReadWrite(const std::string& dir, uint64_t file_bytes,
                                      uint64_t io_bytes, unsigned queue_depth);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_FIO_H_
