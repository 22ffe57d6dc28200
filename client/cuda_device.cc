// The CUDA Device (device.h): device memory from cudaMalloc, pinned host
// memory from cudaHostAlloc, and one non-blocking stream of its own on which
// every copy and kernel runs and is waited for. The kernels, which read or
// write the trainer's buffers, first wait for the work queued on the legacy
// default stream (an event); copies between the client's own buffers do
// not, so that they overlap the trainer's compute. Built where the CUDA
// toolkit is found.
#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/device.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_memory.h"
#include "kernels/cuda/cuda_status.h"

namespace strata {
namespace {

void FreeDevice(void* data) { cudaFree(data); }
void FreePinned(void* data) { cudaFreeHost(data); }

class Cuda : public Device {
 public:
  Cuda(int ordinal, cudaStream_t stream, cudaEvent_t trainer_done)
      : ordinal_(ordinal), stream_(stream), trainer_done_(trainer_done) {}
  ~Cuda() override {
    cudaSetDevice(ordinal_);
    cudaEventDestroy(trainer_done_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  bool is_host() const override { return false; }
  int cuda_ordinal() const override { return ordinal_; }
  bool Holds(const void* data) const override { return CudaDeviceOf(data) == ordinal_; }

  absl::StatusOr<DeviceMemory> Allocate(size_t size_bytes) override {
    if (size_bytes == 0) return DeviceMemory();
    RETURN_IF_ERROR(Select());
    void* data = nullptr;
    if (cudaMalloc(&data, size_bytes) != cudaSuccess) {
      cudaGetLastError();  // not sticky: the next call may succeed
      return absl::ResourceExhaustedError(
          absl::StrCat(name(), ": cannot allocate ", size_bytes, " bytes of device memory"));
    }
    DeviceMemory memory(data, size_bytes, &FreeDevice);
    RETURN_IF_ERROR(Zero(data, size_bytes));
    return memory;
  }

  absl::StatusOr<DeviceMemory> AllocateHost(size_t size_bytes) override {
    if (size_bytes == 0) return DeviceMemory();
    RETURN_IF_ERROR(Select());
    void* data = nullptr;
    if (cudaHostAlloc(&data, size_bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat(name(), ": cannot allocate ", size_bytes, " bytes of pinned host memory"));
    }
    std::memset(data, 0, size_bytes);
    return DeviceMemory(data, size_bytes, &FreePinned);
  }

  absl::Status Copy(void* to, const void* from, size_t size_bytes) override {
    if (size_bytes == 0) return absl::OkStatus();
    return OnStream([&] {
      return CudaStatus(cudaMemcpyAsync(to, from, size_bytes, cudaMemcpyDefault, stream_), "copy");
    });
  }

  absl::Status Zero(void* to, size_t size_bytes) override {
    if (size_bytes == 0) return absl::OkStatus();
    return OnStream(
        [&] { return CudaStatus(cudaMemsetAsync(to, 0, size_bytes, stream_), "memset"); });
  }

  absl::Status AccumulateScaled(DType dtype, const float* x, float scale, void* acc,
                                size_t n) override {
    return OnStream([&]() -> absl::Status {
      RETURN_IF_ERROR(AfterTrainersWork());
      return CudaAccumulateScaled(dtype, x, scale, acc, n, stream_);
    });
  }

  absl::Status CastToFloat(DType dtype, const void* from, float* to, size_t n) override {
    return OnStream([&]() -> absl::Status {
      RETURN_IF_ERROR(AfterTrainersWork());
      return CudaCastToFloat(dtype, from, to, n, stream_);
    });
  }

 private:
  absl::Status Select() { return CudaStatus(cudaSetDevice(ordinal_), "set device"); }

  // Has stream_ wait for the work queued so far on the legacy default stream
  // (where the trainer computed the gradients it hands over, or still reads
  // the parameters about to be written).
  absl::Status AfterTrainersWork() {
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(trainer_done_, cudaStreamLegacy), "record"));
    return CudaStatus(cudaStreamWaitEvent(stream_, trainer_done_, 0), "wait event");
  }

  // Queues `enqueue`'s work on the stream and waits for it. One caller at a
  // time, so that each waits for its own work only.
  template <typename Fn>
  absl::Status OnStream(Fn enqueue) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Select());
    RETURN_IF_ERROR(enqueue());
    return CudaStatus(cudaStreamSynchronize(stream_), "synchronize");
  }

  const int ordinal_;
  absl::Mutex mu_;
  cudaStream_t stream_;       // non-blocking
  cudaEvent_t trainer_done_;  // the legacy default stream's work; under mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("device cuda:", ordinal, ": this machine has ", count, " CUDA device(s)"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "set device"));
  cudaStream_t stream;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  cudaEvent_t trainer_done;
  if (absl::Status s =
          CudaStatus(cudaEventCreateWithFlags(&trainer_done, cudaEventDisableTiming), "event");
      !s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Device>(new Cuda(ordinal, stream, trainer_done));
}

}  // namespace strata
