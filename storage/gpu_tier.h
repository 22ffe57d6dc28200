// The GPU tier: chunk extents in one GPU's memory (cudaMalloc, zeroed),
// within a byte budget that it never exceeds, so that the optimizer runs on
// them in place (Tier::DeviceAddress). Reads and writes are copies between
// host and device memory that complete inline. Thread-safe: every call makes
// the tier's device current on the calling thread first.
//
// Built where the CUDA toolkit is found; elsewhere OpenGpuTier() refuses
// (storage/gpu_tier_unavailable.cc) and GpuCount() is 0.
#ifndef STRATA_STORAGE_GPU_TIER_H_
#define STRATA_STORAGE_GPU_TIER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "storage/tier.h"

namespace strata {

// GPUs this process can use: 0 without CUDA or a device.
int GpuCount();

// The GPU tier on `device` with `budget_bytes`; a budget of 0 takes 80% of
// the memory free on the device now. FAILED_PRECONDITION where strata was
// built without CUDA or `device` is not a GPU of this machine,
// RESOURCE_EXHAUSTED when the budget exceeds the device's free memory.
absl::StatusOr<std::unique_ptr<Tier>> OpenGpuTier(int device, uint64_t budget_bytes);

// Page-locks host memory for the GPUs (cudaHostRegister), so that they copy
// to and from it by DMA, and undoes it. The error names CUDA's cause;
// FAILED_PRECONDITION where strata was built without CUDA.
absl::Status PinForGpu(void* data, uint64_t num_bytes);
void UnpinForGpu(void* data);

}  // namespace strata

#endif  // STRATA_STORAGE_GPU_TIER_H_
