#include "shard/chunk_saver.h"

#include "core/parallel_for.h"

namespace strata {
namespace {

// Chunks written at a time.
constexpr size_t kParallelWrites = 2;

}  // namespace

absl::StatusOr<std::vector<SavedChunk>> SaveArmedChunks(
    const std::vector<std::shared_ptr<Chunk>>& chunks) {
  std::vector<SavedChunk> saved(chunks.size());
  absl::Status status = ParallelFor(
      chunks.size(), kParallelWrites,
      [&](size_t, size_t i) -> absl::Status {
        absl::StatusOr<uint64_t> checksum = chunks[i]->SaveCheckpoint(&saved[i].loss_scale);
        if (!checksum.ok()) return checksum.status();
        saved[i].checksum = *checksum;
        return absl::OkStatus();
      },
      [&](size_t i) { chunks[i]->CancelCheckpoint(); });
  if (!status.ok()) return status;
  return saved;
}

}  // namespace strata
