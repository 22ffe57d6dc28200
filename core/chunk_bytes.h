// The bytes a chunk of the flat space takes, for the shard servers that hold
// it and the coordinator that places it. Stateless.
#ifndef STRATA_CORE_CHUNK_BYTES_H_
#define STRATA_CORE_CHUNK_BYTES_H_

#include <cstdint>

#include "strata/types.h"

namespace strata {

// The bytes of the FP32 state (p, m and v) of `num_params` parameters: in
// memory, in a checkpoint's or a clean shutdown's chunk file.
inline uint64_t StateBytes(uint64_t num_params) { return 3 * num_params * sizeof(float); }

// Bytes of the host extent that holds a chunk's two low-precision copies
// (the applied step's and the one before it).
inline uint64_t ChunkCopyBytes(uint64_t num_params, DType dtype) {
  return 2 * num_params * DTypeSize(dtype);
}

// Bytes a chunk of `num_params` takes in a tier: p, m, v and the two copies.
inline uint64_t ChunkBytes(uint64_t num_params, DType dtype) {
  return StateBytes(num_params) + ChunkCopyBytes(num_params, dtype);
}

}  // namespace strata

#endif  // STRATA_CORE_CHUNK_BYTES_H_
