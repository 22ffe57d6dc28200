// PushedGrads: the gradients of one push as the apply reads them. A push's
// bytes arrive in pieces that end wherever a receive buffer did, at any
// byte; PushedGrads cuts them into GradRanges (state_view.h) over the whole
// elements where they lie, and copies only what it must: an element cut
// between two pieces, or everything when the pieces are so small that
// describing them would cost more memory than copying them.
//
// Thread-safety: immutable once made; the pieces it was cut from must stay
// unchanged while its ranges are read.
#ifndef STRATA_SHARD_PUSHED_GRADS_H_
#define STRATA_SHARD_PUSHED_GRADS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "shard/state_view.h"

namespace strata {

class PushedGrads {
 public:
  // Pieces shorter than this on average are copied into one buffer.
  static constexpr size_t kMinMeanPieceBytes = 4096;

  // The gradients of elements [offset, offset + n) of a chunk, `element_bytes`
  // each, given by `pieces` in order; INVALID_ARGUMENT when the pieces do not
  // hold n elements' bytes.
  static absl::StatusOr<PushedGrads> Cut(uint64_t offset, uint64_t n, size_t element_bytes,
                                         absl::Span<const absl::string_view> pieces);

  // The ranges, in order, covering [offset, offset + n).
  const std::vector<GradRange>& ranges() const { return ranges_; }

 private:
  PushedGrads() = default;

  std::vector<GradRange> ranges_;
  // The copied bytes the ranges point into (a moved vector keeps its buffer).
  std::vector<std::byte> copied_;
};

}  // namespace strata

#endif  // STRATA_SHARD_PUSHED_GRADS_H_
