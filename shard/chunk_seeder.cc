#include "shard/chunk_seeder.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"
#include "rpc/step_wire.h"

namespace strata {
namespace {

// One ReadState's worth of a chunk, and what became of it.
struct Piece {
  size_t chunk = 0;  // index in the request's chunks
  uint64_t begin = 0, num_params = 0;
  int64_t step = 0;  // the source's applied step when read
  uint64_t bytes = 0;
  bool previous = false;  // whether the copy of the step before came along
  absl::Status status;
};

// Reads `piece` from the source and writes it here.
void SeedPiece(const SeedSource& source, DType dtype, StatePrecision precision,
               const WriteStatePiece& write, Piece* piece) {
  v1::WriteStateRequest here;
  std::string& stored = *here.mutable_stored_state();
  stored.resize(StateBytes(piece->num_params, precision));
  const absl::Span<std::byte> into(reinterpret_cast<std::byte*>(stored.data()), stored.size());
  absl::StatusOr<int64_t> step =
      ReadStoredState(source, piece->begin, piece->num_params, {&into, 1});
  if (!step.ok()) {
    piece->status = step.status();
    return;
  }
  piece->step = *step;
  here.set_job_id(source.job_id);
  here.set_flat_begin(piece->begin);
  here.set_step(piece->step);
  here.set_num_params(piece->num_params);
  // The copy of the step before, where the source keeps it (ABORTED: not
  // after a restart, nor at step 0); the new copy serves that step only
  // once every piece brought it.
  if (piece->step > 0) {
    absl::StatusOr<std::optional<std::string>> before =
        PullCopyAt(source, piece->step - 1, piece->begin, piece->num_params, dtype);
    if (!before.ok()) {
      piece->status = before.status();
      return;
    }
    if (before->has_value()) {
      here.set_previous_params(std::move(**before));
      piece->previous = true;
    }
  }
  piece->bytes = here.stored_state().size() + here.previous_params().size();
  piece->status = write(here);
}

}  // namespace

absl::Status InSeedStreams(size_t count, const std::function<absl::Status(size_t)>& each) {
  std::vector<absl::Status> status(count);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto stream = [&] {
    for (size_t i = next++; i < count && !failed.load(); i = next++) {
      status[i] = each(i);
      if (!status[i].ok()) failed = true;
    }
  };
  std::vector<std::thread> streams;
  for (size_t s = 1; s < std::min<size_t>(kSeedStreams, count); ++s) streams.emplace_back(stream);
  stream();
  for (std::thread& t : streams) t.join();
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReadStoredState(const SeedSource& source, uint64_t begin, uint64_t n,
                                        absl::Span<const absl::Span<std::byte>> out) {
  v1::ReadStateRequest read;
  read.set_job_id(source.job_id);
  read.set_flat_begin(begin);
  read.set_num_params(n);
  read.set_stored(true);
  grpc::ByteBuffer response;
  RETURN_IF_ERROR(AtSource(CallRawUnary(source.generic.get(), kReadStateMethod, MessageBuffer(read),
                                        &response, source.call_timeout),
                           source.address));
  int64_t step = 0;
  RETURN_IF_ERROR(AtSource(ReadStoredStateResponse(&response, &step, out), source.address));
  return step;
}

absl::StatusOr<std::optional<std::string>> PullCopyAt(const SeedSource& source, int64_t step,
                                                      uint64_t begin, uint64_t n, DType dtype) {
  v1::PullRequest pull;
  pull.set_job_id(source.job_id);
  pull.set_step(step);
  pull.set_flat_begin(begin);
  pull.set_num_params(n);
  pull.set_snapshot(true);  // the source trains on while the answer travels
  v1::PullResponse copy;
  absl::Status pulled =
      CallUnary(source.stub.get(), &v1::ShardServer::Stub::Pull, pull, &copy, source.call_timeout);
  if (absl::IsAborted(pulled)) return std::nullopt;
  RETURN_IF_ERROR(AtSource(pulled, source.address));
  if (copy.params().size() != n * DTypeSize(dtype)) {
    return AtSource(absl::InternalError(absl::StrCat("a pull of ", copy.params().size(),
                                                     " bytes for ", n, " params")),
                    source.address);
  }
  return std::move(*copy.mutable_params());
}

absl::Status AtSource(const absl::Status& status, const std::string& address) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("source shard server ", address, ": ", status.message()));
}

absl::StatusOr<SeededChunks> SeedChunkStates(const SeedSource& source,
                                             const std::vector<v1::ChunkSpec>& chunks, DType dtype,
                                             StatePrecision precision,
                                             const WriteStatePiece& write) {
  std::vector<Piece> pieces;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const uint64_t end = chunks[c].flat_begin() + chunks[c].num_params();
    for (uint64_t begin = chunks[c].flat_begin(); begin < end; begin += kSeedPieceParams) {
      pieces.push_back({c, begin, std::min(kSeedPieceParams, end - begin)});
    }
  }
  RETURN_IF_ERROR(InSeedStreams(pieces.size(), [&](size_t i) {
    SeedPiece(source, dtype, precision, write, &pieces[i]);
    return pieces[i].status;
  }));
  SeededChunks seeded;
  std::vector<bool> previous(chunks.size(), true);
  std::vector<const Piece*> first_of(chunks.size(), nullptr);
  for (const Piece& piece : pieces) {
    const Piece*& first = first_of[piece.chunk];
    if (first == nullptr) first = &piece;
    if (piece.step != first->step) {
      return absl::AbortedError(absl::StrCat(
          "chunk ", chunks[piece.chunk].chunk_id(), " of job ", source.job_id, " on shard server ",
          source.address, " went from step ", first->step, " to ", piece.step, " during its copy"));
    }
    seeded.bytes += piece.bytes;
    previous[piece.chunk] = previous[piece.chunk] && piece.previous;
  }
  seeded.previous = static_cast<uint32_t>(std::count(previous.begin(), previous.end(), true));
  return seeded;
}

}  // namespace strata
