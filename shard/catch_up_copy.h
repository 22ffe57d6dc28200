// CatchUpCopy: a new copy of one chunk, built on this server while its job
// trains on the chunk's other copies. The source's state arrives in pieces
// in its stored form (state_math.h: FP32 or 8-bit moments, the same bits),
// each at the step the source had applied when it was read (SetPiece);
// each piece then replays the steps the source applied since, from the
// source's step log (Replay). The update is elementwise (8-bit moments:
// blockwise, pieces are whole blocks) and deterministic, its rounding
// drawn from the parameters' places in the model, so a piece that replayed
// up to step t holds the bits the source held at t, and so does the chunk
// once every piece is at t: WriteInto() puts it into the chunk allocated
// for it.
//
// Memory: the state, and apart each piece's low-precision copies of its
// last two steps (what Chunk keeps for pulls). Where the new chunk is
// allocated already and lends them (Chunk::LendForSeed: its state in host
// memory), the copy is built in the chunk itself, and WriteInto() that
// chunk only commits it: no copy, and no memory faulted in but the
// chunk's. Otherwise both come from a StateArena, given back when the copy
// goes; the state is a piece of a chunk state's size, which the arena
// keeps for the new chunk's saves once its reservation is made
// (StateArena::Reserve), with no memory faulted in again.
//
// Thread-safety: distinct pieces may be filled and replayed from different
// threads at once; everything else one thread at a time.
#ifndef STRATA_SHARD_CATCH_UP_COPY_H_
#define STRATA_SHARD_CATCH_UP_COPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/adam.h"
#include "shard/chunk.h"
#include "shard/chunk_groups.h"
#include "shard/state_arena.h"
#include "shard/state_view.h"
#include "strata/types.h"
#include "strata/v1/common.pb.h"

namespace strata {

class CatchUpCopy {
 public:
  struct Piece {
    uint64_t offset = 0;  // from the chunk's first parameter
    uint64_t n = 0;
    int64_t step = -1;      // the step it holds; -1 until SetPiece()
    bool previous = false;  // whether its copy of step - 1 is kept
  };

  // An empty copy of `chunk` of a job of `dtype` and states of `precision`,
  // updated with `adam` and `groups`, in pieces of at most `piece_params` (a
  // multiple of kInt8StateBlock): built in `in_place` (nullable; the new
  // chunk allocated for it, of the same range, dtype and state shape) when
  // it lends its memory, else in memory from `arena` (which must outlive
  // the copy); RESOURCE_EXHAUSTED when the arena refuses it.
  static absl::StatusOr<std::unique_ptr<CatchUpCopy>> Create(
      const v1::ChunkSpec& chunk, DType dtype, StatePrecision precision, AdamConfig adam,
      ChunkGroups groups, uint64_t piece_params, StateArena* arena,
      std::shared_ptr<Chunk> in_place = nullptr);
  ~CatchUpCopy();
  CatchUpCopy(const CatchUpCopy&) = delete;
  CatchUpCopy& operator=(const CatchUpCopy&) = delete;

  const v1::ChunkSpec& chunk() const { return chunk_; }
  DType dtype() const { return dtype_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Sets piece i to `stored`, the source's state of it at `step` in its
  // stored form: the piece is at `step`, without its copy of the step
  // before. INVALID_ARGUMENT for another size; the piece is then unchanged.
  absl::Status SetPiece(size_t i, int64_t step, absl::string_view stored);
  // Where piece i's stored form goes (StoredRangeSpans): the source's
  // stored state of it, read into these spans one after another, then
  // PieceRead(i, step) sets the piece as SetPiece does.
  std::vector<absl::Span<std::byte>> PieceSpans(size_t i) const;
  void PieceRead(size_t i, int64_t step);
  // Piece i's copy of step pieces()[i].step - 1 (n values of the dtype),
  // for the source's, then SetPrevious(i).
  std::byte* previous(size_t i);
  void SetPrevious(size_t i) { pieces_[i].previous = true; }
  // Applies the step after piece i's to it: `grads` are the piece's
  // gradients in the job's dtype, `coef`, `lr` and `group_lrs` the step's
  // scalars (as the source's chunk applied them). INVALID_ARGUMENT for
  // another step, grads of another size or a group_lrs of another count;
  // the piece is then unchanged.
  absl::Status Replay(size_t i, int64_t step, float coef, float lr,
                      const std::vector<float>& group_lrs, absl::string_view grads);
  // The lowest and the highest step of a piece (min_step: -1 while a piece
  // was not set).
  int64_t min_step() const;
  int64_t max_step() const;
  // Whether every piece keeps its copy of the step before.
  bool has_previous() const;
  // Whether the copy is built in the chunk that lent its memory.
  bool in_place() const { return in_place_; }
  // Writes the copy into `chunk` (allocated for it: the same range, at no
  // step yet) at the step of its pieces, with the copy of the step before
  // when every piece keeps one; the chunk that lent its memory commits it
  // there, and then holds it alone. FAILED_PRECONDITION when the pieces are
  // at different steps; the chunk's error otherwise.
  absl::Status WriteInto(Chunk& chunk);

 private:
  CatchUpCopy(const v1::ChunkSpec& chunk, DType dtype, StatePrecision precision, AdamConfig adam,
              ChunkGroups groups, uint64_t piece_params, StateArena* arena,
              std::shared_ptr<Chunk> lender, std::byte* state, std::byte* copies);
  uint64_t num_params() const { return chunk_.num_params(); }
  uint64_t copies_bytes() const { return ChunkCopyBytes(num_params(), dtype_); }
  // The copy of `step`: the two copies alternate, as in Chunk.
  std::byte* copy(int64_t step) const;

  const v1::ChunkSpec chunk_;
  const DType dtype_;
  const AdamConfig adam_;
  const ChunkGroups groups_;
  StateArena* const arena_;
  // Whether the memory is a chunk's (else the arena's); the chunk, until
  // WriteInto() it.
  const bool in_place_;
  std::shared_ptr<Chunk> lender_;
  const StateShape shape_;
  std::byte* const state_memory_;   // shape_.bytes()
  std::byte* const copies_memory_;  // copies_bytes(): the two copies
  const StateView state_;
  std::vector<Piece> pieces_;
};

}  // namespace strata

#endif  // STRATA_SHARD_CATCH_UP_COPY_H_
