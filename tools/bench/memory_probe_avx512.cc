// The memory probes with 64-byte vectors (compiled with -mavx512f).
#include <immintrin.h>

#include "tools/bench/memory_probe.h"
#include "tools/bench/memory_probe_impl.h"

namespace strata {
namespace {

struct Vec512 {
  static constexpr size_t kBytes = 64;
  using T = __m512i;
  static T Zero() { return _mm512_setzero_si512(); }
  static T Splat(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static T Or(T a, T b) { return _mm512_or_si512(a, b); }
  static T Load(const uint8_t* p) { return _mm512_load_si512(p); }
  static void Store(uint8_t* p, T x, bool stream) {
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<T*>(p), x);
    } else {
      _mm512_store_si512(p, x);
    }
  }
  static void Fence() { _mm_sfence(); }
  static uint64_t Low64(T x) {
    return static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(x)));
  }
};

}  // namespace

const MemoryProbes& Avx512Probes() {
  static const MemoryProbes probes{"avx512", &probe_internal::AdamStreams<Vec512>,
                                   &probe_internal::Read<Vec512>,
                                   &probe_internal::ReadWrite<Vec512>};
  return probes;
}

}  // namespace strata
