// SaveArmedChunks(): the shard server's half of a checkpoint. Writes the
// state of each chunk at its armed step (Chunk::SaveCheckpoint), a few chunks
// at a time so that one chunk's checksum and sync overlap another's writes
// and the disk does not wait.
//
// Stateless; the chunks must be armed and at their step
// (Chunk::AwaitCheckpointStep() returned OK).
#ifndef STRATA_SHARD_CHUNK_SAVER_H_
#define STRATA_SHARD_CHUNK_SAVER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shard/chunk.h"
#include "strata/v1/shard.pb.h"

namespace strata {

struct SavedChunk {
  uint64_t checksum = 0;
  // The loss scaler the step's pushes reported, if any.
  std::optional<LossScaleState> loss_scale;
};

// Writes each chunk to the path it was armed with. On the first error, the
// chunks not yet written are disarmed and that error (naming the file) is
// returned.
absl::StatusOr<std::vector<SavedChunk>> SaveArmedChunks(
    const std::vector<std::shared_ptr<Chunk>>& chunks);

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_SAVER_H_
