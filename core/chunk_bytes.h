// The bytes a chunk of the flat space takes, for the shard servers that hold
// it and the coordinator that places it. Stateless.
#ifndef STRATA_CORE_CHUNK_BYTES_H_
#define STRATA_CORE_CHUNK_BYTES_H_

#include <cstdint>

#include "strata/types.h"

namespace strata {

// Parameters per block of an 8-bit state: each block of m and of v has one
// FP32 scale (kernels/int8_adam.h).
inline constexpr uint64_t kInt8StateBlock = 256;

// Scales a state of n parameters holds, per moment.
inline constexpr uint64_t Int8StateBlocks(uint64_t n) {
  return (n + kInt8StateBlock - 1) / kInt8StateBlock;
}

// The state (p, m and v) of `num_params` parameters is one buffer, in
// memory, in a tier and in a checkpoint's or a clean shutdown's chunk file:
// p (FP32), then
//   kFp32: m, v (FP32);
//   kInt8: the scales of m's blocks, of v's blocks (FP32), then the codes of
//          m, of v (one byte per parameter).
// Every array starts 4-byte aligned when the buffer does.
inline uint64_t StateBytes(uint64_t num_params, StatePrecision precision) {
  if (precision == StatePrecision::kInt8) {
    return num_params * (sizeof(float) + 2) + 2 * sizeof(float) * Int8StateBlocks(num_params);
  }
  return 3 * num_params * sizeof(float);
}

// Bytes of the host extent that holds a chunk's two low-precision copies
// (the applied step's and the one before it).
inline uint64_t ChunkCopyBytes(uint64_t num_params, DType dtype) {
  return 2 * num_params * DTypeSize(dtype);
}

// Bytes a chunk of `num_params` takes in a tier: p, m, v and the two copies.
inline uint64_t ChunkBytes(uint64_t num_params, DType dtype, StatePrecision precision) {
  return StateBytes(num_params, precision) + ChunkCopyBytes(num_params, dtype);
}

}  // namespace strata

#endif  // STRATA_CORE_CHUNK_BYTES_H_
