// The memory probes written once over a vector type V (32 or 64 bytes) and
// compiled twice (memory_probe_avx2.cc, memory_probe_avx512.cc) so that each
// CPU is probed with its widest loads and stores. V supplies: kBytes, T,
// Zero(), Or(a, b), Load(const void*), Store(void*, T, bool stream), Fence().
// Internal to tools/bench; see memory_probe.h for the contract.
#ifndef STRATA_TOOLS_BENCH_MEMORY_PROBE_IMPL_H_
#define STRATA_TOOLS_BENCH_MEMORY_PROBE_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace strata {
namespace probe_internal {
namespace {

// Elements per probe iteration: every stream, 1-byte ones included, moves
// whole vectors.
constexpr size_t kGroup = 64;

// Elements ahead that the probes prefetch (as the kernels do).
constexpr size_t kPrefetchElements = 512;

// A zero the compiler cannot see through, so that storing back what was
// loaded is not optimized away.
inline volatile uint32_t opaque_zero = 0;

inline const uint8_t* At(const void* base, size_t offset) {
  return static_cast<const uint8_t*>(base) + offset;
}
inline uint8_t* At(void* base, size_t offset) { return static_cast<uint8_t*>(base) + offset; }

template <typename V>
void AdamStreams(float* p, void* m, void* v, size_t state_bytes, const void* g, size_t grad_bytes,
                 void* copy, size_t copy_bytes, bool stream_copy, size_t n) {
  typename V::T salt = V::Splat(opaque_zero);
  typename V::T last = V::Zero();
  for (size_t i = 0; i < n; i += kGroup) {
    // Prefetched as far ahead as the kernel prefetches, so the probe is no
    // slower than the kernel could be at moving these bytes.
    for (size_t line = 0; line < kGroup * 4; line += 64) {
      __builtin_prefetch(At(p, (i + kPrefetchElements) * 4 + line), 1);
    }
    for (size_t line = 0; line < kGroup * state_bytes; line += 64) {
      __builtin_prefetch(At(m, (i + kPrefetchElements) * state_bytes + line), 1);
      __builtin_prefetch(At(v, (i + kPrefetchElements) * state_bytes + line), 1);
    }
    for (size_t line = 0; line < kGroup * grad_bytes; line += 64) {
      __builtin_prefetch(At(g, (i + kPrefetchElements) * grad_bytes + line));
    }
    for (auto [stream, bytes] :
         {std::pair<void*, size_t>{p, 4}, {m, state_bytes}, {v, state_bytes}}) {
      for (size_t off = 0; off < kGroup * bytes; off += V::kBytes) {
        uint8_t* at = At(stream, i * bytes + off);
        V::Store(at, V::Or(V::Load(at), salt), false);
      }
    }
    for (size_t off = 0; off < kGroup * grad_bytes; off += V::kBytes) {
      last = V::Or(last, V::Load(At(g, i * grad_bytes + off)));
    }
    for (size_t off = 0; off < kGroup * copy_bytes; off += V::kBytes) {
      V::Store(At(copy, i * copy_bytes + off), last, stream_copy);
    }
  }
  if (stream_copy) V::Fence();
}

template <typename V>
uint64_t Read(const void* in, size_t element_bytes, size_t n) {
  typename V::T acc = V::Zero();
  for (size_t off = 0; off < n * element_bytes; off += V::kBytes)
    acc = V::Or(acc, V::Load(At(in, off)));
  return V::Low64(acc);
}

template <typename V>
void ReadWrite(const void* in, size_t in_bytes, void* out, size_t out_bytes, bool stream,
               size_t n) {
  typename V::T last = V::Zero();
  for (size_t i = 0; i < n; i += kGroup) {
    for (size_t off = 0; off < kGroup * in_bytes; off += V::kBytes) {
      last = V::Or(last, V::Load(At(in, i * in_bytes + off)));
    }
    for (size_t off = 0; off < kGroup * out_bytes; off += V::kBytes) {
      V::Store(At(out, i * out_bytes + off), last, stream);
    }
  }
  if (stream) V::Fence();
}

}  // namespace
}  // namespace probe_internal
}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_MEMORY_PROBE_IMPL_H_
