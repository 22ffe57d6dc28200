#include "server/chunk_saver.h"

#include <algorithm>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace strata {
namespace {

// Chunks written at a time.
constexpr size_t kParallelWrites = 2;
// How far ahead of the next chunk to write the reserver may go.
constexpr size_t kReserveAhead = 4;

}  // namespace

absl::StatusOr<std::vector<SavedChunk>> SaveArmedChunks(
    const std::vector<std::shared_ptr<Chunk>>& chunks, const std::vector<std::string>& paths) {
  const size_t n = chunks.size();
  std::vector<absl::StatusOr<SavedChunk>> saved(n, absl::UnknownError("not saved"));
  absl::Mutex mu;
  size_t next = 0;  // the next chunk to write
  bool failed = false;

  std::thread reserver([&] {
    for (size_t i = 0; i < n; ++i) {
      {
        absl::MutexLock lock(&mu);
        auto may_reserve = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          return failed || i < next + kReserveAhead;
        };
        mu.Await(absl::Condition(&may_reserve));
        if (failed || i < next) continue;  // a writer reserves its own
      }
      chunks[i]->ReserveCheckpointBuffer();
    }
  });
  auto write = [&] {
    for (;;) {
      size_t i;
      {
        absl::MutexLock lock(&mu);
        if (next == n) return;
        i = next++;
        if (failed) {
          chunks[i]->CancelCheckpoint();
          continue;
        }
      }
      SavedChunk chunk;
      absl::StatusOr<uint64_t> checksum = chunks[i]->SaveCheckpoint(paths[i], &chunk.loss_scale);
      if (checksum.ok()) {
        chunk.checksum = *checksum;
        saved[i] = chunk;
      } else {
        saved[i] = checksum.status();
        absl::MutexLock lock(&mu);
        failed = true;
      }
    }
  };
  std::vector<std::thread> writers;
  for (size_t t = 1; t < std::min(kParallelWrites, n); ++t) writers.emplace_back(write);
  write();
  for (std::thread& writer : writers) writer.join();
  reserver.join();

  std::vector<SavedChunk> result;
  for (absl::StatusOr<SavedChunk>& chunk : saved) {
    if (!chunk.ok()) return chunk.status();
    result.push_back(*std::move(chunk));
  }
  return result;
}

}  // namespace strata
