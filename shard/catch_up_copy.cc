#include "shard/catch_up_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"
#include "shard/state_math.h"

namespace strata {

absl::StatusOr<std::unique_ptr<CatchUpCopy>> CatchUpCopy::Create(
    const v1::ChunkSpec& chunk, DType dtype, StatePrecision precision, AdamConfig adam,
    ChunkGroups groups, uint64_t piece_params, StateArena* arena, std::shared_ptr<Chunk> in_place) {
  const StateShape shape{chunk.num_params(), precision};
  if (in_place != nullptr && in_place->dtype() == dtype &&
      in_place->range().begin == chunk.flat_begin() &&
      in_place->range().size() == chunk.num_params() &&
      in_place->state_shape().precision == precision) {
    if (std::optional<Chunk::SeedBuffers> lent = in_place->LendForSeed(); lent.has_value()) {
      return std::unique_ptr<CatchUpCopy>(
          new CatchUpCopy(chunk, dtype, precision, adam, std::move(groups), piece_params, arena,
                          std::move(in_place), lent->state, lent->copies));
    }
  }
  // A chunk has at most kMaxChunkNumParams, so these do not overflow.
  const uint64_t state_bytes = shape.bytes();
  const uint64_t copies_bytes = ChunkCopyBytes(chunk.num_params(), dtype);
  auto refused = [&](const absl::Status& s) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory to build a copy of chunk ", chunk.chunk_id(), " aside (",
                     state_bytes + copies_bytes, " bytes): ", s.message()));
  };
  absl::StatusOr<std::byte*> state = arena->Take(state_bytes);
  if (!state.ok()) return refused(state.status());
  absl::StatusOr<std::byte*> copies = arena->Take(copies_bytes);
  if (!copies.ok()) {
    arena->Give(*state, state_bytes);
    return refused(copies.status());
  }
  return std::unique_ptr<CatchUpCopy>(new CatchUpCopy(chunk, dtype, precision, adam,
                                                      std::move(groups), piece_params, arena,
                                                      nullptr, *state, *copies));
}

CatchUpCopy::CatchUpCopy(const v1::ChunkSpec& chunk, DType dtype, StatePrecision precision,
                         AdamConfig adam, ChunkGroups groups, uint64_t piece_params,
                         StateArena* arena, std::shared_ptr<Chunk> lender, std::byte* state,
                         std::byte* copies)
    : chunk_(chunk),
      dtype_(dtype),
      adam_(adam),
      groups_(std::move(groups)),
      arena_(arena),
      in_place_(lender != nullptr),
      lender_(std::move(lender)),
      shape_{chunk.num_params(), precision},
      state_memory_(state),
      copies_memory_(copies),
      state_(shape_.ViewOf(state)) {
  for (uint64_t offset = 0; offset < chunk.num_params(); offset += piece_params) {
    pieces_.push_back({offset, std::min(piece_params, chunk.num_params() - offset)});
  }
}

CatchUpCopy::~CatchUpCopy() {
  if (in_place_) {
    if (lender_ != nullptr) lender_->EndSeedLoan();
    return;
  }
  arena_->Give(state_memory_, shape_.bytes());
  arena_->Give(copies_memory_, copies_bytes());
}

std::byte* CatchUpCopy::copy(int64_t step) const {
  return copies_memory_ + (step & 1) * num_params() * DTypeSize(dtype_);
}

absl::Status CatchUpCopy::SetPiece(size_t i, int64_t step, absl::string_view stored) {
  Piece& piece = pieces_[i];
  const uint64_t want = StateBytes(piece.n, shape_.precision);
  if (stored.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_.chunk_id(), " piece at ",
                                                   piece.offset, ": a state of ", stored.size(),
                                                   " bytes for ", want));
  }
  WriteStoredRange(shape_, state_, piece.offset, piece.n,
                   reinterpret_cast<const std::byte*>(stored.data()));
  PieceRead(i, step);
  return absl::OkStatus();
}

std::vector<absl::Span<std::byte>> CatchUpCopy::PieceSpans(size_t i) const {
  return StoredRangeSpans(shape_, state_, pieces_[i].offset, pieces_[i].n);
}

void CatchUpCopy::PieceRead(size_t i, int64_t step) {
  Piece& piece = pieces_[i];
  piece.step = step;
  piece.previous = false;
  CastFromFloat(state_.p + piece.offset, dtype_, copy(step) + piece.offset * DTypeSize(dtype_),
                piece.n);
}

std::byte* CatchUpCopy::previous(size_t i) {
  return copy(pieces_[i].step - 1) + pieces_[i].offset * DTypeSize(dtype_);
}

absl::Status CatchUpCopy::Replay(size_t i, int64_t step, float coef, float lr,
                                 const std::vector<float>& group_lrs, absl::string_view grads) {
  Piece& piece = pieces_[i];
  const size_t esize = DTypeSize(dtype_);
  if (piece.step < 0 || step != piece.step + 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk_.chunk_id(), " piece at ",
                                                   piece.offset, " holds step ", piece.step,
                                                   "; step ", step, " is not its next"));
  }
  if (grads.size() != piece.n * esize) {
    return absl::InvalidArgumentError(absl::StrCat("grads: ", grads.size(), " bytes for ", piece.n,
                                                   " params of ", esize, " bytes"));
  }
  if (!group_lrs.empty() && group_lrs.size() != groups_.num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat("group_lrs: ", group_lrs.size(),
                                                   " learning rates for ", groups_.num_groups(),
                                                   " parameter group(s)"));
  }
  // The piece's gradients alone: ApplyAdamStep updates the piece's blocks
  // and nothing else.
  const GradRange range{piece.offset, piece.n, grads.data()};
  ApplyAdamStep(shape_, state_, state_,
                SpanConstants(groups_, num_params(), adam_, lr, group_lrs, step, coef), {range},
                dtype_, copy(step), chunk_.flat_begin(), step);
  piece.step = step;
  piece.previous = true;
  return absl::OkStatus();
}

int64_t CatchUpCopy::min_step() const {
  int64_t lowest = pieces_.empty() ? -1 : pieces_[0].step;
  for (const Piece& piece : pieces_) lowest = std::min(lowest, piece.step);
  return lowest;
}

int64_t CatchUpCopy::max_step() const {
  int64_t highest = -1;
  for (const Piece& piece : pieces_) highest = std::max(highest, piece.step);
  return highest;
}

bool CatchUpCopy::has_previous() const {
  return std::all_of(pieces_.begin(), pieces_.end(), [](const Piece& p) { return p.previous; });
}

absl::Status CatchUpCopy::WriteInto(Chunk& chunk) {
  const int64_t step = min_step();
  for (const Piece& piece : pieces_) {
    if (piece.step != step) {
      return absl::FailedPreconditionError(absl::StrCat("the copy of chunk ", chunk_.chunk_id(),
                                                        " built aside has pieces at step ", step,
                                                        " and ", piece.step));
    }
  }
  const bool previous = step > 0 && has_previous();
  if (&chunk == lender_.get()) {
    // The copy is the chunk's own memory: committed there, and the chunk's
    // alone from now on.
    const std::shared_ptr<Chunk> lender = std::move(lender_);
    return lender->CommitLentSeed(step, previous);
  }
  const absl::string_view before =
      previous ? absl::string_view(reinterpret_cast<const char*>(copy(step - 1)),
                                   num_params() * DTypeSize(dtype_))
               : absl::string_view();
  return chunk.WriteStoredState(chunk_.flat_begin(), num_params(), step, before, state_memory_);
}

}  // namespace strata
