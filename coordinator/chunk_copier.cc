#include "coordinator/chunk_copier.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

// `status` with `address` named.
absl::Status AtServer(const absl::Status& status, const std::string& address) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("shard server ", address, ": ", status.message()));
}

}  // namespace

absl::StatusOr<CopiedChunk> CopyChunkState(v1::ShardServer::Stub* source,
                                           const std::string& source_address,
                                           v1::ShardServer::Stub* target,
                                           const std::string& target_address,
                                           const std::string& job_id, const v1::ChunkSpec& chunk,
                                           DType dtype, absl::Duration call_timeout) {
  const uint64_t begin = chunk.flat_begin(), end = begin + chunk.num_params();
  const uint64_t num_pieces = (chunk.num_params() + kCopyPieceParams - 1) / kCopyPieceParams;
  // Per piece: the step it was read at, the bytes written, whether the copy
  // of the step before came along, and the error of its calls.
  struct Piece {
    int64_t step = 0;
    uint64_t bytes = 0;
    bool previous = false;
    absl::Status status;
  };
  std::vector<Piece> pieces(num_pieces);
  auto copy_piece = [&](uint64_t i) {
    Piece& piece = pieces[i];
    const uint64_t piece_begin = begin + i * kCopyPieceParams;
    const uint64_t n = std::min(kCopyPieceParams, end - piece_begin);
    v1::ReadStateRequest read;
    read.set_job_id(job_id);
    read.set_flat_begin(piece_begin);
    read.set_num_params(n);
    v1::ReadStateResponse state;
    piece.status =
        AtServer(CallUnary(source, &v1::ShardServer::Stub::ReadState, read, &state, call_timeout),
                 source_address);
    if (!piece.status.ok()) return;
    piece.step = state.applied_step();
    v1::WriteStateRequest write;
    write.set_job_id(job_id);
    write.set_flat_begin(piece_begin);
    write.set_step(piece.step);
    *write.mutable_params() = std::move(*state.mutable_params());
    *write.mutable_exp_avg() = std::move(*state.mutable_exp_avg());
    *write.mutable_exp_avg_sq() = std::move(*state.mutable_exp_avg_sq());
    // The copy of the step before, where the source keeps it (ABORTED: not
    // after a restart, nor at step 0); the target serves that step only
    // once every piece brought it.
    if (piece.step > 0) {
      v1::PullRequest pull;
      pull.set_job_id(job_id);
      pull.set_step(piece.step - 1);
      pull.set_flat_begin(piece_begin);
      pull.set_num_params(n);
      v1::PullResponse before;
      absl::Status pulled =
          CallUnary(source, &v1::ShardServer::Stub::Pull, pull, &before, call_timeout);
      if (pulled.ok() && before.params().size() != n * DTypeSize(dtype)) {
        pulled = absl::InternalError(
            absl::StrCat("a pull of ", before.params().size(), " bytes for ", n, " params"));
      }
      if (!pulled.ok() && !absl::IsAborted(pulled)) {
        piece.status = AtServer(pulled, source_address);
        return;
      }
      if (pulled.ok()) {
        write.set_previous_params(std::move(*before.mutable_params()));
        piece.previous = true;
      }
    }
    piece.bytes = 3 * n * sizeof(float) + write.previous_params().size();
    v1::WriteStateResponse written;
    piece.status = AtServer(
        CallUnary(target, &v1::ShardServer::Stub::WriteState, write, &written, call_timeout),
        target_address);
  };
  // kCopyStreams calls in flight at once, each stream a piece after another.
  std::vector<std::thread> streams;
  for (uint64_t s = 1; s < std::min<uint64_t>(kCopyStreams, num_pieces); ++s) {
    streams.emplace_back([&, s] {
      for (uint64_t i = s; i < num_pieces; i += kCopyStreams) copy_piece(i);
    });
  }
  for (uint64_t i = 0; i < num_pieces; i += kCopyStreams) copy_piece(i);
  for (std::thread& t : streams) t.join();
  CopiedChunk copied;
  copied.previous = num_pieces > 0;
  for (const Piece& piece : pieces) {
    RETURN_IF_ERROR(piece.status);
    if (piece.step != pieces.front().step) {
      return absl::AbortedError(absl::StrCat(
          "chunk ", chunk.chunk_id(), " of job ", job_id, " on shard server ", source_address,
          " went from step ", pieces.front().step, " to ", piece.step, " during its copy"));
    }
    copied.bytes += piece.bytes;
    copied.previous = copied.previous && piece.previous;
  }
  copied.step = pieces.empty() ? 0 : pieces.front().step;
  return copied;
}

}  // namespace strata
