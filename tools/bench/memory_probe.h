// Memory probes: loops that move exactly the bytes a kernel moves (same
// loads, same stores, same kind of store), with no arithmetic, so that a
// kernel's speed can be stated as a fraction of what the memory system does
// with its streams on this machine, in the same run. Pure functions over
// caller-owned memory; thread-safe for disjoint ranges. n must be a multiple
// of 64 and buffers 64-byte aligned.
#ifndef STRATA_TOOLS_BENCH_MEMORY_PROBE_H_
#define STRATA_TOOLS_BENCH_MEMORY_PROBE_H_

#include <cstddef>
#include <cstdint>

namespace strata {

struct MemoryProbes {
  const char* isa;
  // Reads p (FP32), m, v (state_bytes per element) and g (grad_bytes);
  // writes p, m, v in place and `copy` (copy_bytes per element; streamed
  // when `stream_copy`).
  void (*adam_streams)(float* p, void* m, void* v, size_t state_bytes, const void* g,
                       size_t grad_bytes, void* copy, size_t copy_bytes, bool stream_copy,
                       size_t n);
  // Reads n elements of `element_bytes`; returns a value that depends on them.
  uint64_t (*read)(const void* in, size_t element_bytes, size_t n);
  // Reads n elements of in_bytes and writes n of out_bytes (streamed when `stream`).
  void (*read_write)(const void* in, size_t in_bytes, void* out, size_t out_bytes, bool stream,
                     size_t n);
};

const MemoryProbes& Avx2Probes();
const MemoryProbes& Avx512Probes();

// The probes with the widest vectors this CPU has; nullptr without AVX2.
inline const MemoryProbes* BestProbes() {
  if (__builtin_cpu_supports("avx512f")) return &Avx512Probes();
  if (__builtin_cpu_supports("avx2")) return &Avx2Probes();
  return nullptr;
}

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_MEMORY_PROBE_H_
