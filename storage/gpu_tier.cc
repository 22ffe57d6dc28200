#include "storage/gpu_tier.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"

namespace strata {
namespace {

// Device allocations are rounded to this, as cudaMalloc aligns them.
constexpr uint64_t kAlignmentBytes = 256;

class GpuTier : public Tier {
 public:
  GpuTier(int device, uint64_t budget_bytes) : device_(device), budget_bytes_(budget_bytes) {}
  ~GpuTier() override {
    cudaSetDevice(device_);
    for (auto& [id, block] : blocks_) cudaFree(block.data);
  }
  GpuTier(const GpuTier&) = delete;
  GpuTier& operator=(const GpuTier&) = delete;

  TierKind kind() const override { return TierKind::kGpu; }
  uint64_t budget_bytes() const override { return budget_bytes_; }
  uint64_t used_bytes() const override {
    absl::MutexLock lock(&mu_);
    return used_bytes_;
  }

  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override {
    uint64_t rounded;
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(rounded, RoundUpInBudget("gpu tier", num_bytes, kAlignmentBytes, used_bytes_,
                                                budget_bytes_));
      used_bytes_ += rounded;  // reserved while cudaMalloc runs unlocked
    }
    void* data = nullptr;
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaMalloc(&data, rounded == 0 ? kAlignmentBytes : rounded);
    if (e == cudaSuccess) e = cudaMemsetAsync(data, 0, rounded, cudaStreamPerThread);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    if (e != cudaSuccess) {
      if (data != nullptr) cudaFree(data);
      absl::MutexLock lock(&mu_);
      used_bytes_ -= rounded;
      return absl::ResourceExhaustedError(absl::StrCat("gpu tier: GPU ", device_, " refused ",
                                                       rounded, " bytes: ", cudaGetErrorString(e)));
    }
    absl::MutexLock lock(&mu_);
    Extent extent{next_id_++, 0, num_bytes};
    blocks_.emplace(extent.id, Block{static_cast<std::byte*>(data), rounded});
    return extent;
  }

  void Free(const Extent& extent) override {
    Block block;
    {
      absl::MutexLock lock(&mu_);
      auto it = blocks_.find(extent.id);
      if (it == blocks_.end()) return;
      block = it->second;
      used_bytes_ -= block.num_bytes;
      blocks_.erase(it);
    }
    cudaSetDevice(device_);
    cudaFree(block.data);
  }

  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override {
    absl::StatusOr<std::byte*> src = Locate(from, offset, to.size());
    if (!src.ok()) return std::move(done)(src.status());
    std::move(done)(Copy(to.data(), *src, to.size(), cudaMemcpyDeviceToHost));
  }

  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override {
    absl::StatusOr<std::byte*> dst = Locate(to, offset, from.size());
    if (!dst.ok()) return std::move(done)(dst.status());
    std::move(done)(Copy(*dst, from.data(), from.size(), cudaMemcpyHostToDevice));
  }

  std::byte* Map(const Extent&) override { return nullptr; }

  std::byte* DeviceAddress(const Extent& extent) override {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(extent.id);
    return it == blocks_.end() ? nullptr : it->second.data;
  }

 private:
  struct Block {
    std::byte* data = nullptr;
    uint64_t num_bytes = 0;  // as reserved from the budget
  };

  // OUT_OF_RANGE unless [offset, offset + num_bytes) lies in `extent`.
  absl::StatusOr<std::byte*> Locate(const Extent& extent, uint64_t offset, uint64_t num_bytes) {
    RETURN_IF_ERROR(CheckRange("gpu tier", extent.id, extent.num_bytes, offset, num_bytes));
    std::byte* base = DeviceAddress(extent);
    if (base == nullptr)
      return absl::NotFoundError(absl::StrCat("gpu tier: no extent ", extent.id));
    return base + offset;
  }

  // On the calling thread's stream: copies of several threads run at once
  // (cudaMemcpy's legacy stream would order them behind one another).
  absl::Status Copy(void* to, const void* from, uint64_t num_bytes, cudaMemcpyKind kind) {
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess && num_bytes > 0) {
      e = cudaMemcpyAsync(to, from, num_bytes, kind, cudaStreamPerThread);
      if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamPerThread);
    }
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("gpu tier: copy of ", num_bytes, " bytes ",
                                               kind == cudaMemcpyHostToDevice ? "to" : "from",
                                               " GPU ", device_, ": ", cudaGetErrorString(e)));
  }

  const int device_;
  const uint64_t budget_bytes_;
  mutable absl::Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Block> blocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int GpuCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

absl::Status PinForGpu(void* data, uint64_t num_bytes) {
  cudaError_t e = cudaHostRegister(data, num_bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // not sticky: clear it
  return absl::ResourceExhaustedError(absl::StrCat("cudaHostRegister: ", cudaGetErrorString(e)));
}

void UnpinForGpu(void* data) { cudaHostUnregister(data); }

absl::StatusOr<std::unique_ptr<Tier>> OpenGpuTier(int device, uint64_t budget_bytes) {
  const int count = GpuCount();
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU tier: no GPU ", device, " (this machine has ", count, ")"));
  }
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU tier: GPU ", device, ": ", cudaGetErrorString(e)));
  }
  if (budget_bytes == 0) budget_bytes = free_bytes / 10 * 8;
  if (budget_bytes > free_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("GPU tier: a budget of ", budget_bytes, " bytes exceeds the ", free_bytes,
                     " bytes free on GPU ", device, " (of ", total_bytes, ")"));
  }
  return std::unique_ptr<Tier>(new GpuTier(device, budget_bytes));
}

}  // namespace strata
