#!/usr/bin/env bash
# The coordinator binary links no tier code, no liburing, no CUDA and no
# NCCL: it places chunks, it never holds them (docs/layout.md).
set -euo pipefail
binary=$1
libraries=$(ldd "$binary")
if grep -E 'liburing|libcuda|libnccl|libxxhash|libgloo' <<<"$libraries"; then
  echo "$binary links the libraries above" >&2
  exit 1
fi
symbols=$(nm -C "$binary" | grep -E 'strata::(HostTier|NvmeTier|GpuTier|Chunk)::' || true)
if [ -n "$symbols" ]; then
  head -5 <<<"$symbols" >&2
  echo "$binary holds tier or chunk code" >&2
  exit 1
fi
echo "$binary links no tier, io_uring, CUDA, NCCL or Gloo code"
