#include "kernels/int8_adam.h"

namespace strata {
namespace {

// SplitMix64's finalizer: a bijection of 64 bits that mixes every input bit
// into every output bit.
uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint32_t Int8RoundingSeed(uint64_t window, int64_t step) {
  return static_cast<uint32_t>(Mix64(Mix64(window) ^ static_cast<uint64_t>(step)) >> 32);
}

}  // namespace strata
