#include "shard/gpu_chunk_state.h"

#include <cuda_runtime.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace strata {
namespace {

class GpuChunkState : public ChunkState {
 public:
  GpuChunkState(Tier* gpu, std::shared_ptr<StagingPool> staging, Extent extent, int device,
                uint64_t num_params, DType dtype)
      : gpu_(gpu),
        staging_(std::move(staging)),
        extent_(extent),
        device_(device),
        num_params_(num_params),
        dtype_(dtype),
        p_(reinterpret_cast<float*>(gpu->DeviceAddress(extent))),
        scratch_(reinterpret_cast<std::byte*>(p_ + 3 * num_params)) {}
  ~GpuChunkState() override { gpu_->Free(extent_); }

  TierKind tier() const override { return TierKind::kGpu; }
  uint64_t num_bytes() const override { return extent_.num_bytes; }
  StateShape shape() const override { return {num_params_, StatePrecision::kFp32}; }

  absl::StatusOr<StateView> Load() override {
    auto* buffer = new float[3 * num_params_];
    absl::Status read =
        ReadAndWait(*gpu_, extent_, 0, absl::MakeSpan(AsBytes(buffer), shape().bytes()));
    if (!read.ok()) {
      delete[] buffer;
      return read;
    }
    return shape().ViewOf(AsBytes(buffer), AsBytes(buffer));
  }

  absl::Status Commit(const StateView& view) override {
    return WriteAndWait(*gpu_, extent_, 0, absl::MakeConstSpan(view.buffer, shape().bytes()));
  }

  void Release(const StateView& view) override { delete[] view.p; }

  bool updates_in_tier() const override { return true; }

  absl::Status Update(absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                      std::byte* copy) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "set device"));
    cudaStream_t stream = cudaStreamPerThread;
    std::byte* staging = staging_->Acquire();
    absl::Status enqueued = Enqueue(spans, grads, copy, staging, stream);
    // The staging buffer is free once the stream has read it.
    absl::Status done = CudaStatus(cudaStreamSynchronize(stream), "AdamW");
    staging_->Release(staging);
    return enqueued.ok() ? done : enqueued;
  }

 private:
  // Queues Update()'s work on `stream`: the gradients through `staging` to
  // the scratch, the kernel, the copy back to `copy`.
  absl::Status Enqueue(absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                       std::byte* copy, std::byte* staging, cudaStream_t stream) {
    const size_t esize = DTypeSize(dtype_);
    // The ranges cover the chunk in order: gathered, they go to the GPU a
    // batch at a time while the next batch is gathered.
    uint64_t sent = 0;  // bytes of `staging` already on their way
    for (const GradRange& g : grads) {
      std::memcpy(staging + g.offset * esize, g.grads, g.n * esize);
      const uint64_t gathered = (g.offset + g.n) * esize;
      if (gathered - sent < kCopyBatchBytes && gathered < num_params_ * esize) continue;
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(scratch_ + sent, staging + sent, gathered - sent,
                                                 cudaMemcpyHostToDevice, stream),
                                 "copy of gradients"));
      sent = gathered;
    }
    float* m = p_ + num_params_;
    float* v = m + num_params_;
    for (const ConstantsSpan& s : spans) {  // elementwise: the bits of one pass
      std::byte* g = scratch_ + s.offset * esize;
      RETURN_IF_ERROR(CudaAdamUpdate(s.constants, dtype_, g, p_ + s.offset, m + s.offset,
                                     v + s.offset, dtype_, g, s.n, stream));
    }
    return CudaStatus(
        cudaMemcpyAsync(copy, scratch_, num_params_ * esize, cudaMemcpyDeviceToHost, stream),
        "copy of parameters");
  }

  // The gradients go to the GPU in copies of at least this many bytes.
  static constexpr uint64_t kCopyBatchBytes = uint64_t{2} << 20;

  static std::byte* AsBytes(float* p) { return reinterpret_cast<std::byte*>(p); }
  // strata::CudaStatus naming this state's GPU.
  absl::Status CudaStatus(cudaError_t e, const char* what) const {
    return strata::CudaStatus(e, absl::StrCat(what, " on GPU ", device_));
  }

  Tier* const gpu_;
  const std::shared_ptr<StagingPool> staging_;
  const Extent extent_;
  const int device_;
  const uint64_t num_params_;
  const DType dtype_;
  float* const p_;
  std::byte* const scratch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkState>> CreateGpuChunkState(
    Tier* gpu, std::shared_ptr<StagingPool> staging, uint64_t num_params, DType dtype) {
  ASSIGN_OR_RETURN(Extent extent, gpu->Allocate(GpuChunkStateBytes(num_params, dtype)));
  cudaPointerAttributes attributes{};
  cudaError_t e = cudaPointerGetAttributes(&attributes, gpu->DeviceAddress(extent));
  if (e != cudaSuccess || attributes.type != cudaMemoryTypeDevice) {
    gpu->Free(extent);
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU chunk state: the tier's extent is not device memory (", cudaGetErrorString(e), ")"));
  }
  return std::unique_ptr<ChunkState>(
      new GpuChunkState(gpu, std::move(staging), extent, attributes.device, num_params, dtype));
}

}  // namespace strata
