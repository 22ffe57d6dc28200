#include "shard/state_view.h"

namespace strata {

StateView StateShape::ViewOf(std::byte* state, std::byte* buffer) const {
  const uint64_t n = num_params;
  auto* p = reinterpret_cast<float*>(state);
  StateView view;
  view.p = p;
  view.buffer = buffer;
  if (precision == StatePrecision::kInt8) {
    const uint64_t blocks = Int8StateBlocks(n);
    auto* codes = reinterpret_cast<uint8_t*>(p + n + 2 * blocks);
    view.q = Int8Moments{codes, p + n, codes + n, p + n + blocks};
  } else {
    view.m = p + n;
    view.v = p + 2 * n;
  }
  return view;
}

}  // namespace strata
