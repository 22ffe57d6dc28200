// A chunk's state in a file: p, m and v (12 bytes per parameter), written
// and fsynced, with an XXH3 checksum of the contents kept by whoever names
// the file -- a host-memory chunk's ChunkRecord when its shard server stops
// cleanly, or a checkpoint's manifest. Stateless functions.
#ifndef STRATA_SERVER_SAVED_CHUNK_H_
#define STRATA_SERVER_SAVED_CHUNK_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/chunk_state.h"

namespace strata {

// Writes `state` (n parameters) to `path` and syncs it; returns the checksum.
// The I/O error naming the file on failure.
absl::StatusOr<uint64_t> SaveChunkState(const std::string& path, const StateView& state,
                                        uint64_t num_params);
// Reads `path` into `state`: DATA_LOSS naming the file when it is missing or
// its size or checksum is not the recorded one.
absl::Status LoadChunkState(const std::string& path, uint64_t checksum, uint64_t num_params,
                            const StateView& state);

}  // namespace strata

#endif  // STRATA_SERVER_SAVED_CHUNK_H_
