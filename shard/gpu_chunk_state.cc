#include "shard/gpu_chunk_state.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "shard/state_math.h"

namespace strata {
namespace {

class GpuChunkState : public ChunkState {
 public:
  GpuChunkState(Tier* gpu, std::shared_ptr<StagingPool> staging, Extent extent, int device,
                StateShape shape, DType dtype)
      : gpu_(gpu),
        staging_(std::move(staging)),
        extent_(extent),
        device_(device),
        shape_(shape),
        dtype_(dtype),
        state_(shape.ViewOf(gpu->DeviceAddress(extent))),
        scratch_(gpu->DeviceAddress(extent) + GpuScratchOffset(shape)) {}
  ~GpuChunkState() override { gpu_->Free(extent_); }

  TierKind tier() const override { return TierKind::kGpu; }
  uint64_t num_bytes() const override { return extent_.num_bytes; }
  StateShape shape() const override { return shape_; }

  absl::StatusOr<StateView> Load() override {
    auto* buffer = AsBytes(new float[FloatsFor(shape_.bytes())]);
    absl::Status read = ReadAndWait(*gpu_, extent_, 0, absl::MakeSpan(buffer, shape_.bytes()));
    if (!read.ok()) {
      Free(buffer);
      return read;
    }
    return shape_.ViewOf(buffer, buffer);
  }

  absl::Status Commit(const StateView& view) override {
    return WriteAndWait(*gpu_, extent_, 0, absl::MakeConstSpan(view.buffer, shape_.bytes()));
  }

  void Release(const StateView& view) override { Free(view.bytes()); }

  bool updates_in_tier() const override { return true; }

  absl::Status Update(absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                      std::byte* copy, uint64_t flat_begin, int64_t step) override {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "set device"));
    cudaStream_t stream = cudaStreamPerThread;
    std::byte* staging = staging_->Acquire();
    // An 8-bit state's blocks that spans share: stepped on the host after
    // the rest, from the gradients still in `staging`.
    std::vector<uint64_t> shared_blocks;
    absl::Status enqueued =
        Enqueue(spans, grads, copy, flat_begin, step, staging, stream, &shared_blocks);
    absl::Status done = CudaStatus(cudaStreamSynchronize(stream), "AdamW");
    for (size_t i = 0; enqueued.ok() && done.ok() && i < shared_blocks.size(); ++i) {
      done = UpdateOnHost(shared_blocks[i], spans, staging, copy, flat_begin, step, stream);
    }
    // The staging buffer is free once the stream has read it.
    staging_->Release(staging);
    return enqueued.ok() ? done : enqueued;
  }

 private:
  // Queues Update()'s work on `stream`: the gradients through `staging` to
  // the scratch, the kernels, the copy back to `copy`. Leaves out, and
  // lists in `shared_blocks`, the blocks of an 8-bit state that spans share.
  absl::Status Enqueue(absl::Span<const ConstantsSpan> spans, absl::Span<const GradRange> grads,
                       std::byte* copy, uint64_t flat_begin, int64_t step, std::byte* staging,
                       cudaStream_t stream, std::vector<uint64_t>* shared_blocks) {
    const uint64_t n = shape_.num_params;
    const size_t esize = DTypeSize(dtype_);
    // The ranges cover the chunk in order: gathered, they go to the GPU a
    // batch at a time while the next batch is gathered.
    uint64_t sent = 0;  // bytes of `staging` already on their way
    for (const GradRange& g : grads) {
      std::memcpy(staging + g.offset * esize, g.grads, g.n * esize);
      const uint64_t gathered = (g.offset + g.n) * esize;
      if (gathered - sent < kCopyBatchBytes && gathered < n * esize) continue;
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(scratch_ + sent, staging + sent, gathered - sent,
                                                 cudaMemcpyHostToDevice, stream),
                                 "copy of gradients"));
      sent = gathered;
    }
    if (shape_.precision == StatePrecision::kInt8) {
      // The kernel reads each gradient before it writes that element's copy.
      const GradRange all{0, n, scratch_};
      Int8StepPlan plan = PlanInt8Step(n, spans, {&all, 1}, dtype_, flat_begin, step);
      for (const Int8Run& r : plan.runs) {
        auto* g = const_cast<std::byte*>(r.grads);
        RETURN_IF_ERROR(CudaAdamUpdateInt8(*r.constants, dtype_, g, state_.p + r.first,
                                           MomentsAt(state_.q, r.first), r.rounding, dtype_, g,
                                           r.count, stream));
      }
      *shared_blocks = std::move(plan.shared_blocks);
    } else {
      for (const ConstantsSpan& s : spans) {  // elementwise: the bits of one pass
        std::byte* g = scratch_ + s.offset * esize;
        RETURN_IF_ERROR(CudaAdamUpdate(s.constants, dtype_, g, state_.p + s.offset,
                                       state_.m + s.offset, state_.v + s.offset, dtype_, g, s.n,
                                       stream));
      }
    }
    return CudaStatus(cudaMemcpyAsync(copy, scratch_, n * esize, cudaMemcpyDeviceToHost, stream),
                      "copy of parameters");
  }

  // Steps the shared block of an 8-bit state from element `block` on
  // (ApplyAdamStepToBlock): its stored form brought to the host, stepped
  // with the gradients in `staging`, its copy written to `copy`, sent back.
  // After the stream's other work.
  absl::Status UpdateOnHost(uint64_t block, absl::Span<const ConstantsSpan> spans,
                            const std::byte* staging, std::byte* copy, uint64_t flat_begin,
                            int64_t step, cudaStream_t stream) {
    const uint64_t n = std::min(kInt8StateBlock, shape_.num_params - block);
    const StateShape block_shape{n, StatePrecision::kInt8};
    std::vector<float> buffer(FloatsFor(block_shape.bytes()));
    std::byte* const on_host = AsBytes(buffer.data());
    // The block's arrays on the GPU, whose bytes one after another are the
    // block's state.
    const std::vector<absl::Span<std::byte>> on_gpu = StoredRangeSpans(shape_, state_, block, n);
    auto copy_all = [&](cudaMemcpyKind kind) -> absl::Status {
      std::byte* at = on_host;
      for (const absl::Span<std::byte>& part : on_gpu) {
        const bool to_host = kind == cudaMemcpyDeviceToHost;
        RETURN_IF_ERROR(
            CudaStatus(cudaMemcpyAsync(to_host ? at : part.data(), to_host ? part.data() : at,
                                       part.size(), kind, stream),
                       "copy of a shared block"));
        at += part.size();
      }
      return CudaStatus(cudaStreamSynchronize(stream), "copy of a shared block");
    };
    RETURN_IF_ERROR(copy_all(cudaMemcpyDeviceToHost));
    ApplyAdamStepToBlock(shape_.num_params, block, block_shape.ViewOf(on_host), spans, staging,
                         dtype_, copy, flat_begin, step);
    return copy_all(cudaMemcpyHostToDevice);
  }

  // The gradients go to the GPU in copies of at least this many bytes.
  static constexpr uint64_t kCopyBatchBytes = uint64_t{2} << 20;

  static uint64_t FloatsFor(uint64_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  static std::byte* AsBytes(void* p) { return static_cast<std::byte*>(p); }
  static void Free(std::byte* buffer) { delete[] reinterpret_cast<float*>(buffer); }
  // strata::CudaStatus naming this state's GPU.
  absl::Status CudaStatus(cudaError_t e, const char* what) const {
    return strata::CudaStatus(e, absl::StrCat(what, " on GPU ", device_));
  }

  Tier* const gpu_;
  const std::shared_ptr<StagingPool> staging_;
  const Extent extent_;
  const int device_;
  const StateShape shape_;
  const DType dtype_;
  const StateView state_;  // device pointers
  std::byte* const scratch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkState>> CreateGpuChunkState(
    Tier* gpu, std::shared_ptr<StagingPool> staging, StateShape shape, DType dtype) {
  ASSIGN_OR_RETURN(Extent extent, gpu->Allocate(GpuChunkStateBytes(shape, dtype)));
  cudaPointerAttributes attributes{};
  cudaError_t e = cudaPointerGetAttributes(&attributes, gpu->DeviceAddress(extent));
  if (e != cudaSuccess || attributes.type != cudaMemoryTypeDevice) {
    gpu->Free(extent);
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU chunk state: the tier's extent is not device memory (", cudaGetErrorString(e), ")"));
  }
  return std::unique_ptr<ChunkState>(
      new GpuChunkState(gpu, std::move(staging), extent, attributes.device, shape, dtype));
}

}  // namespace strata
