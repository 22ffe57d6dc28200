// The host Device (device.h) and OpenDevice()'s parsing of a device's name.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/device.h"
#include "kernels/elementwise.h"

namespace strata {
namespace {

// This machine's memory in bytes (the most any allocation can get).
uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return UINT64_MAX;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
}

class Host : public Device {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  int cuda_ordinal() const override { return -1; }
  bool Holds(const void*) const override { return true; }

  absl::StatusOr<DeviceMemory> Allocate(size_t size_bytes) override {
    if (size_bytes == 0) return DeviceMemory();
    const uint64_t physical = PhysicalMemoryBytes();
    void* data = size_bytes > physical ? nullptr : std::calloc(size_bytes, 1);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("host memory: cannot allocate ", size_bytes,
                                                       " bytes (this machine has ", physical, ")"));
    }
    return DeviceMemory(data, size_bytes, &std::free);
  }
  absl::StatusOr<DeviceMemory> AllocateHost(size_t size_bytes) override {
    return Allocate(size_bytes);
  }

  absl::Status Copy(void* to, const void* from, size_t size_bytes) override {
    if (size_bytes > 0) std::memcpy(to, from, size_bytes);
    return absl::OkStatus();
  }
  absl::Status Zero(void* to, size_t size_bytes) override {
    if (size_bytes > 0) std::memset(to, 0, size_bytes);
    return absl::OkStatus();
  }
  absl::Status AccumulateScaled(DType dtype, const float* x, float scale, void* acc,
                                size_t n) override {
    strata::AccumulateScaled(dtype, x, scale, acc, n);
    return absl::OkStatus();
  }
  absl::Status CastToFloat(DType dtype, const void* from, float* to, size_t n) override {
    strata::CastToFloat(dtype, from, to, n);
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Device> HostDevice() { return std::make_unique<Host>(); }

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(absl::string_view name) {
  if (name == "cpu") return HostDevice();
  absl::string_view ordinal = name;
  if (absl::ConsumePrefix(&ordinal, "cuda")) {
    if (ordinal.empty()) return OpenCudaDevice(0);
    int n = -1;
    if (absl::ConsumePrefix(&ordinal, ":") && absl::SimpleAtoi(ordinal, &n) && n >= 0) {
      return OpenCudaDevice(n);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device '", name, "' is not cpu, cuda or cuda:N (N >= 0)"));
}

}  // namespace strata
