#include "shard/catch_up_copy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"

namespace strata {

absl::StatusOr<std::unique_ptr<CatchUpCopy>> CatchUpCopy::Create(const v1::ChunkSpec& chunk,
                                                                 DType dtype, AdamConfig adam,
                                                                 ChunkGroups groups,
                                                                 uint64_t piece_params,
                                                                 StateArena* arena) {
  // p, m, v, then two copies; a chunk has at most kMaxChunkNumParams, so
  // this does not overflow.
  const uint64_t bytes = chunk.num_params() * (3 * sizeof(float) + 2 * DTypeSize(dtype));
  absl::StatusOr<std::byte*> memory = arena->Take(bytes);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory to build a copy of chunk ",
                                                     chunk.chunk_id(), " aside (", bytes,
                                                     " bytes): ", memory.status().message()));
  }
  return std::unique_ptr<CatchUpCopy>(
      new CatchUpCopy(chunk, dtype, adam, std::move(groups), piece_params, arena, *memory, bytes));
}

CatchUpCopy::CatchUpCopy(const v1::ChunkSpec& chunk, DType dtype, AdamConfig adam,
                         ChunkGroups groups, uint64_t piece_params, StateArena* arena,
                         std::byte* memory, uint64_t bytes)
    : chunk_(chunk),
      dtype_(dtype),
      adam_(adam),
      groups_(std::move(groups)),
      arena_(arena),
      memory_(memory),
      bytes_(bytes),
      p_(reinterpret_cast<float*>(memory)) {
  for (uint64_t offset = 0; offset < chunk.num_params(); offset += piece_params) {
    pieces_.push_back({offset, std::min(piece_params, chunk.num_params() - offset)});
  }
}

CatchUpCopy::~CatchUpCopy() { arena_->Give(memory_, bytes_); }

std::byte* CatchUpCopy::copy(int64_t step) const {
  return memory_ + 3 * num_params() * sizeof(float) + (step & 1) * num_params() * DTypeSize(dtype_);
}

void CatchUpCopy::SetPiece(size_t i, int64_t step) {
  Piece& piece = pieces_[i];
  piece.step = step;
  piece.previous = false;
  CastFromFloat(p(i), dtype_, copy(step) + piece.offset * DTypeSize(dtype_), piece.n);
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
  float* const m_all = p_ + num_params();
  float* const v_all = p_ + 2 * num_params();
  std::byte* const copy_out = copy(step);
  for (const ConstantsSpan& span :
       SpanConstants(groups_, num_params(), adam_, lr, group_lrs, step, coef)) {
    const uint64_t offset = std::max(piece.offset, span.offset);
    const uint64_t end = std::min(piece.offset + piece.n, span.offset + span.n);
    if (offset >= end) continue;
    AdamUpdate(span.constants, dtype_, grads.data() + (offset - piece.offset) * esize, p_ + offset,
               m_all + offset, v_all + offset, dtype_, copy_out + offset * esize, end - offset);
  }
  piece.step = step;
  piece.previous = true;
  return absl::OkStatus();
}

int64_t CatchUpCopy::min_step() const {
  int64_t lowest = pieces_.empty() ? -1 : pieces_[0].step;
  for (const Piece& piece : pieces_) lowest = std::min(lowest, piece.step);
  return lowest;
}

absl::Status CatchUpCopy::WriteInto(Chunk& chunk) {
  const int64_t step = min_step();
  bool previous = step > 0;
  for (const Piece& piece : pieces_) {
    if (piece.step != step) {
      return absl::FailedPreconditionError(absl::StrCat("the copy of chunk ", chunk_.chunk_id(),
                                                        " built aside has pieces at step ", step,
                                                        " and ", piece.step));
    }
    previous = previous && piece.previous;
  }
  const size_t esize = DTypeSize(dtype_);
  const absl::string_view before =
      previous
          ? absl::string_view(reinterpret_cast<const char*>(copy(step - 1)), num_params() * esize)
          : absl::string_view();
  return chunk.WriteState(chunk_.flat_begin(), p_, p_ + num_params(), p_ + 2 * num_params(),
                          num_params(), step, before);
}

}  // namespace strata
