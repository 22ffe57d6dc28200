// SeedChunkStates: a shard server seeds new copies of chunks from their live
// copies on another server, reading the source itself (SeedChunks RPC):
// their states as stored (FP32 or 8-bit moments: the same bits) in pieces
// of at most kSeedPieceParams (ReadState), each with the source's copy of
// the step before where it keeps one (Pull), so that a new copy can serve
// a torn step's recompute as the source would.
// The pieces of every chunk go kSeedStreams at a time, across chunk
// boundaries, and each is handed to `write` (the local WriteState). The
// source must hold still (fenced: AllocateChunks with a generation its
// workers have not formed). Blocking; thread-safe.
#ifndef STRATA_SHARD_CHUNK_SEEDER_H_
#define STRATA_SHARD_CHUNK_SEEDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/chunk_bytes.h"
#include "strata/types.h"
#include "strata/v1/common.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

// The most params one ReadState of a seed carries (3 MiB of FP32 state;
// whole blocks of 8-bit states), and how many pieces are read at once:
// small enough that reads and writes overlap, far below the server's read
// limit and the message limit.
inline constexpr uint64_t kSeedPieceParams = uint64_t{1} << 18;
static_assert(kSeedPieceParams % kInt8StateBlock == 0);
inline constexpr uint64_t kSeedStreams = 4;

// The shard server a seed reads: typed stub, generic stub (ReadState's
// answer is read into place: rpc/step_wire.h) over the same channel, its
// address (for errors), the job, and how long each call may take.
struct SeedSource {
  std::unique_ptr<v1::ShardServer::Stub> stub;
  std::unique_ptr<grpc::GenericStub> generic;
  std::string address;
  std::string job_id;
  absl::Duration call_timeout;
};

// `status` with the source shard server at `address` named.
absl::Status AtSource(const absl::Status& status, const std::string& address);
// Runs `each(i)` for every i in [0, count), kSeedStreams at a time, until
// one fails; the first failure in index order.
absl::Status InSeedStreams(size_t count, const std::function<absl::Status(size_t)>& each);
// Reads the stored state of [begin, begin + n) of the source's chunk
// (ReadState) into `out`, span after span, which take exactly its bytes;
// returns the step the source had applied. The source's error, naming it.
absl::StatusOr<int64_t> ReadStoredState(const SeedSource& source, uint64_t begin, uint64_t n,
                                        absl::Span<const absl::Span<std::byte>> out);
// The source's copy of `step` of [begin, begin + n) in `dtype` (Pull), or
// nullopt where it keeps none (ABORTED: not after a restart, nor at step 0);
// its error, naming it, otherwise.
absl::StatusOr<std::optional<std::string>> PullCopyAt(const SeedSource& source, int64_t step,
                                                      uint64_t begin, uint64_t n, DType dtype);

// What a seed wrote.
struct SeededChunks {
  uint64_t bytes = 0;     // of state and copies of the step before
  uint32_t previous = 0;  // chunks whose copy of the step before came along
};

// Writes one piece here (p, m, v at the source's step, and the copy of the
// step before when it came); the first error ends the seed.
using WriteStatePiece = std::function<absl::Status(const v1::WriteStateRequest& piece)>;

// Copies `chunks` of the source's job (dtype `dtype`, states of
// `precision`) through `write`. ABORTED when a chunk's pieces were read at
// different steps (the source was not fenced); else the first error of a
// read or a write, a read's naming the source.
absl::StatusOr<SeededChunks> SeedChunkStates(const SeedSource& source,
                                             const std::vector<v1::ChunkSpec>& chunks, DType dtype,
                                             StatePrecision precision,
                                             const WriteStatePiece& write);

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_SEEDER_H_
