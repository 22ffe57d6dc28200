#include "shard/pushed_grads.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<PushedGrads> PushedGrads::Cut(uint64_t offset, uint64_t n, size_t element_bytes,
                                             absl::Span<const absl::string_view> pieces) {
  uint64_t bytes = 0;
  for (absl::string_view piece : pieces) bytes += piece.size();
  uint64_t want_bytes;
  if (__builtin_mul_overflow(n, element_bytes, &want_bytes) || bytes != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("grads has ", bytes, " bytes, not ", n,
                                                   " gradients of ", element_bytes, " bytes"));
  }
  PushedGrads grads;
  if (pieces.size() > 1 && pieces.size() > bytes / kMinMeanPieceBytes) {
    grads.copied_.resize(bytes);
    std::byte* at = grads.copied_.data();
    for (absl::string_view piece : pieces) {
      std::memcpy(at, piece.data(), piece.size());
      at += piece.size();
    }
    if (n > 0) grads.ranges_.push_back(GradRange{offset, n, grads.copied_.data()});
    return grads;
  }
  // Room for one cut element per boundary between pieces.
  grads.copied_.resize(pieces.size() * element_bytes);
  std::byte* joined = grads.copied_.data();
  uint64_t element = offset;
  size_t partial = 0;  // bytes of the cut element gathered so far
  for (absl::string_view piece : pieces) {
    const char* at = piece.data();
    size_t left = piece.size();
    if (partial > 0) {
      const size_t take = std::min(element_bytes - partial, left);
      std::memcpy(joined + partial, at, take);
      partial += take;
      at += take;
      left -= take;
      if (partial < element_bytes) continue;
      grads.ranges_.push_back(GradRange{element++, 1, joined});
      joined += element_bytes;
      partial = 0;
    }
    if (const uint64_t whole = left / element_bytes; whole > 0) {
      grads.ranges_.push_back(GradRange{element, whole, at});
      element += whole;
      at += whole * element_bytes;
      left -= whole * element_bytes;
    }
    std::memcpy(joined, at, left);
    partial = left;
  }
  return grads;
}

}  // namespace strata
