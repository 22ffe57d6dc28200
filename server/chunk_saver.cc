#include "server/chunk_saver.h"

#include <algorithm>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace strata {
namespace {

// Chunks written at a time.
constexpr size_t kParallelWrites = 2;

}  // namespace

absl::StatusOr<std::vector<SavedChunk>> SaveArmedChunks(
    const std::vector<std::shared_ptr<Chunk>>& chunks, const std::vector<std::string>& paths) {
  const size_t n = chunks.size();
  std::vector<SavedChunk> saved(n);
  absl::Mutex mu;
  size_t next = 0;     // the next chunk to write
  absl::Status error;  // the first

  auto write = [&] {
    for (;;) {
      size_t i;
      {
        absl::MutexLock lock(&mu);
        if (next == n) return;
        i = next++;
        if (!error.ok()) {
          chunks[i]->CancelCheckpoint();
          continue;
        }
      }
      absl::StatusOr<uint64_t> checksum = chunks[i]->SaveCheckpoint(paths[i], &saved[i].loss_scale);
      if (checksum.ok()) {
        saved[i].checksum = *checksum;
        continue;
      }
      absl::MutexLock lock(&mu);
      if (error.ok()) error = checksum.status();
    }
  };
  std::vector<std::thread> writers;
  for (size_t t = 1; t < std::min(kParallelWrites, n); ++t) writers.emplace_back(write);
  write();
  for (std::thread& writer : writers) writer.join();
  if (!error.ok()) return error;
  return saved;
}

}  // namespace strata
