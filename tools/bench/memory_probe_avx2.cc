// The memory probes with 32-byte vectors (compiled with -mavx2).
#include <immintrin.h>

#include "tools/bench/memory_probe.h"
#include "tools/bench/memory_probe_impl.h"

namespace strata {
namespace {

struct Vec256 {
  static constexpr size_t kBytes = 32;
  using T = __m256i;
  static T Zero() { return _mm256_setzero_si256(); }
  static T Splat(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static T Or(T a, T b) { return _mm256_or_si256(a, b); }
  static T Load(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const T*>(p)); }
  static void Store(uint8_t* p, T x, bool stream) {
    if (stream) {
      _mm256_stream_si256(reinterpret_cast<T*>(p), x);
    } else {
      _mm256_store_si256(reinterpret_cast<T*>(p), x);
    }
  }
  static void Fence() { _mm_sfence(); }
  static uint64_t Low64(T x) { return static_cast<uint64_t>(_mm256_extract_epi64(x, 0)); }
};

}  // namespace

const MemoryProbes& Avx2Probes() {
  static const MemoryProbes probes{"avx2", &probe_internal::AdamStreams<Vec256>,
                                   &probe_internal::Read<Vec256>,
                                   &probe_internal::ReadWrite<Vec256>};
  return probes;
}

}  // namespace strata
