// CopyChunkState: seeds a new copy of a chunk on one shard server from a
// live copy on another, the coordinator relaying: FP32 p, m and v in pieces
// of at most kCopyPieceParams (ReadState, WriteState), each with the
// source's copy of the step before where it keeps one (Pull), so that the
// new copy can serve a torn step's recompute as the source would; pieces
// are copied kCopyStreams at a time. The
// source must hold still (fenced: AllocateChunks with a generation its
// workers have not formed), the target's chunk must be newly allocated.
// Blocking; thread-safe.
#ifndef STRATA_COORDINATOR_CHUNK_COPIER_H_
#define STRATA_COORDINATOR_CHUNK_COPIER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/types.h"
#include "strata/v1/common.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

// The most params one ReadState/WriteState of a copy carries (3 MiB of
// state), and how many pieces are copied at once: small enough that reads,
// relays and writes overlap, far below the server's read limit and the
// message limit.
inline constexpr uint64_t kCopyPieceParams = uint64_t{1} << 18;
inline constexpr uint64_t kCopyStreams = 4;

// What a copy moved.
struct CopiedChunk {
  int64_t step = 0;       // the applied step of the source, now the target's
  uint64_t bytes = 0;     // of state and copies written to the target
  bool previous = false;  // whether the copy of the step before came along
};

// Copies `chunk` of job `job_id` (dtype `dtype`) from `source` to `target`;
// every call ends within `call_timeout`. ABORTED when the source changed
// step during the copy (it was not fenced; the target refuses the pieces
// of another step too); the first error of a call otherwise, naming the
// server by `source_address` or `target_address`.
absl::StatusOr<CopiedChunk> CopyChunkState(v1::ShardServer::Stub* source,
                                           const std::string& source_address,
                                           v1::ShardServer::Stub* target,
                                           const std::string& target_address,
                                           const std::string& job_id, const v1::ChunkSpec& chunk,
                                           DType dtype, absl::Duration call_timeout);

}  // namespace strata

#endif  // STRATA_COORDINATOR_CHUNK_COPIER_H_
