// Device: the memory a worker's flat parameter and gradient buffers live in
// -- the model's device -- and the work the client does on them there:
// allocation, copies between it and host memory, zeroing, and the two
// elementwise kernels the client runs over its buffers (accumulating the
// trainer's FP32 gradients, casting parameters out to FP32).
//
// Two implementations pass one conformance suite (tests/unit/device_test.cc):
// the host ("cpu": host memory and the CPU kernels; the Gloo path and CI)
// and CUDA ("cuda:N": device memory, CUDA's kernels, a stream of its own for
// copies, pinned host memory for what crosses to the shard servers). The
// CUDA kernels give the CPU kernels' bits, so a worker on either trains the
// same master weights.
//
// Every call returns once its work is done, so its results are visible to the
// caller's next read, copy or NCCL operation. CUDA: work runs on the device's
// own stream; the kernels (which read the trainer's gradients or write its
// parameters) first wait for the work queued on the legacy default stream,
// where a trainer that names no stream computes; copies do not, so that the
// client's own traffic overlaps the trainer's compute.
//
// Thread-safe: any thread may call any method; calls from two threads run in
// some order.
#ifndef STRATA_CLIENT_DEVICE_H_
#define STRATA_CLIENT_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "strata/types.h"

namespace strata {

// A block of a Device's memory (or of host memory it copies to at full
// speed), freed when destroyed. Move-only. Not thread-safe.
class DeviceMemory {
 public:
  using Free = void (*)(void* data);
  DeviceMemory() = default;
  DeviceMemory(void* data, size_t size_bytes, Free free)
      : data_(static_cast<uint8_t*>(data)), size_bytes_(size_bytes), free_(free) {}
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_bytes_ = std::exchange(other.size_bytes_, 0);
      free_ = other.free_;
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { Reset(); }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_bytes_; }
  bool empty() const { return size_bytes_ == 0; }
  // Frees the block; empty afterwards.
  void Reset() {
    if (data_ != nullptr) free_(data_);
    data_ = nullptr;
    size_bytes_ = 0;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
  Free free_ = nullptr;
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  // Whether Allocate() gives host memory (then Slice buffers may be windows
  // of it and nothing crosses).
  virtual bool is_host() const = 0;
  // The CUDA device ordinal; -1 for the host.
  virtual int cuda_ordinal() const = 0;
  // Whether `data` is in this device's memory, where the caller's spans must
  // be (the host device cannot tell host memory from another device's and
  // says true).
  virtual bool Holds(const void* data) const = 0;

  // `size_bytes` zeroed bytes of this device's memory (none for 0).
  // RESOURCE_EXHAUSTED naming the size when the device has too little.
  virtual absl::StatusOr<DeviceMemory> Allocate(size_t size_bytes) = 0;
  // `size_bytes` zeroed bytes of host memory that the device copies to and
  // from by DMA (pinned for CUDA): what crosses to the shard servers.
  virtual absl::StatusOr<DeviceMemory> AllocateHost(size_t size_bytes) = 0;

  // Copies `size_bytes` from `from` to `to`, each in this device's memory or
  // in host memory; the two do not overlap.
  virtual absl::Status Copy(void* to, const void* from, size_t size_bytes) = 0;
  // Zeros `size_bytes` of this device's memory at `to`.
  virtual absl::Status Zero(void* to, size_t size_bytes) = 0;
  // acc[i] = round(float(acc[i]) + scale * x[i]) in `dtype`, as
  // kernels/elementwise.h's AccumulateScaled; `x` (FP32) and `acc` in this
  // device's memory.
  virtual absl::Status AccumulateScaled(DType dtype, const float* x, float scale, void* acc,
                                        size_t n) = 0;
  // to[i] = float(from[i]); both in this device's memory.
  virtual absl::Status CastToFloat(DType dtype, const void* from, float* to, size_t n) = 0;
};

// Makes `*scratch` at least `size_bytes` of `device`'s memory: a new,
// zeroed block where it is smaller (what it held is not kept), else as it
// is. Errors are Allocate()'s.
inline absl::Status GrowScratch(Device& device, size_t size_bytes, DeviceMemory* scratch) {
  if (scratch->size() >= size_bytes) return absl::OkStatus();
  scratch->Reset();  // freed first: the old and the new block are not held at once
  absl::StatusOr<DeviceMemory> grown = device.Allocate(size_bytes);
  if (!grown.ok()) return grown.status();
  *scratch = *std::move(grown);
  return absl::OkStatus();
}

// The device a worker named: "cpu", "cuda" (device 0) or "cuda:N".
// INVALID_ARGUMENT naming `device` for another name; FAILED_PRECONDITION
// where strata was built without CUDA or the machine has no such GPU.
absl::StatusOr<std::unique_ptr<Device>> OpenDevice(absl::string_view name);

// The host device (never fails).
std::unique_ptr<Device> HostDevice();

// The CUDA device `ordinal`: FAILED_PRECONDITION without CUDA or that GPU.
absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal);

}  // namespace strata

#endif  // STRATA_CLIENT_DEVICE_H_
