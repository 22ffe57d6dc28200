// The Device conformance suite (client/device.h): the host device and the
// CUDA one pass the same tests -- zeroed allocations, copies in every
// direction, zeroing a range, and the accumulation and cast kernels against
// the CPU's scalar kernels bit for bit. The CUDA instantiation skips itself
// where no GPU is present (or strata has no CUDA).
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kernel_table.h"
#include "testing/test_seed.h"

namespace strata {
namespace {

const size_t kSizes[] = {0, 1, 15, 17, 64 * 1024 + 3};

class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Device>> device = OpenDevice(GetParam());
    if (!device.ok() && absl::IsFailedPrecondition(device.status())) {
      GTEST_SKIP() << device.status();
    }
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    rng_.seed(testing::TestSeed());
  }

  // `bytes` in a fresh block of the device's memory.
  DeviceMemory OnDevice(const std::vector<uint8_t>& bytes) {
    absl::StatusOr<DeviceMemory> memory = device_->Allocate(bytes.size());
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (!memory.ok()) return DeviceMemory();
    EXPECT_TRUE(device_->Copy(memory->data(), bytes.data(), bytes.size()).ok());
    return std::move(*memory);
  }
  template <typename T>
  DeviceMemory OnDevice(const std::vector<T>& values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(T));
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return OnDevice(bytes);
  }
  std::vector<uint8_t> OnHost(const DeviceMemory& memory, size_t size_bytes) {
    std::vector<uint8_t> bytes(size_bytes);
    EXPECT_TRUE(device_->Copy(bytes.data(), memory.data(), size_bytes).ok());
    return bytes;
  }
  std::vector<uint8_t> RandomBytes(size_t n) {
    std::vector<uint8_t> bytes(n);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng_());
    return bytes;
  }
  // `n` values of `dtype` (finite, normal-ish), as bytes.
  std::vector<uint8_t> RandomValues(DType dtype, size_t n) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> floats(n);
    for (float& f : floats) f = normal(rng_);
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    ScalarKernels().cast_from_float(floats.data(), dtype, bytes.data(), n);
    return bytes;
  }

  std::unique_ptr<Device> device_;
  std::mt19937 rng_;
};

TEST_P(DeviceTest, AllocatesZeroedMemoryOfTheSizeAsked) {
  for (size_t n : kSizes) {
    absl::StatusOr<DeviceMemory> memory = device_->Allocate(n);
    ASSERT_TRUE(memory.ok()) << memory.status();
    EXPECT_EQ(memory->size(), n);
    EXPECT_EQ(memory->empty(), n == 0);
    EXPECT_EQ(OnHost(*memory, n), std::vector<uint8_t>(n, 0)) << n;
    absl::StatusOr<DeviceMemory> host = device_->AllocateHost(n);
    ASSERT_TRUE(host.ok()) << host.status();
    ASSERT_EQ(host->size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(host->data()[i], 0) << i;
    if (n > 0) host->data()[n - 1] = 7;  // host memory: the CPU writes it
  }
}

TEST_P(DeviceTest, RefusesAnAllocationLargerThanItsMemory) {
  const size_t huge = size_t{1} << 60;
  absl::StatusOr<DeviceMemory> memory = device_->Allocate(huge);
  ASSERT_FALSE(memory.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(memory.status())) << memory.status();
  EXPECT_NE(memory.status().message().find(std::to_string(huge)), std::string::npos);
  // The device is still good.
  absl::StatusOr<DeviceMemory> small = device_->Allocate(64);
  ASSERT_TRUE(small.ok()) << small.status();
}

TEST_P(DeviceTest, TellsItsMemoryFromHostMemory) {
  absl::StatusOr<DeviceMemory> mine = device_->Allocate(64);
  ASSERT_TRUE(mine.ok());
  EXPECT_TRUE(device_->Holds(mine->data()));
  EXPECT_TRUE(device_->Holds(mine->data() + 63));
  std::vector<float> host(16);
  absl::StatusOr<DeviceMemory> pinned = device_->AllocateHost(64);
  ASSERT_TRUE(pinned.ok());
  // Host memory is the host device's own; a GPU's is not.
  EXPECT_EQ(device_->Holds(host.data()), device_->is_host());
  EXPECT_EQ(device_->Holds(pinned->data()), device_->is_host());
}

TEST_P(DeviceTest, CopiesInEveryDirection) {
  for (size_t n : kSizes) {
    const std::vector<uint8_t> bytes = RandomBytes(n);
    DeviceMemory a = OnDevice(bytes);  // host -> device
    absl::StatusOr<DeviceMemory> b = device_->Allocate(n);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(device_->Copy(b->data(), a.data(), n).ok());  // device -> device
    absl::StatusOr<DeviceMemory> pinned = device_->AllocateHost(n);
    ASSERT_TRUE(pinned.ok());
    ASSERT_TRUE(device_->Copy(pinned->data(), b->data(), n).ok());  // device -> pinned host
    EXPECT_EQ(std::vector<uint8_t>(pinned->data(), pinned->data() + n), bytes) << n;
    EXPECT_EQ(OnHost(*b, n), bytes) << n;  // device -> pageable host
  }
  // Windows at odd offsets.
  const std::vector<uint8_t> bytes = RandomBytes(1001);
  DeviceMemory a = OnDevice(bytes);
  std::vector<uint8_t> window(500);
  ASSERT_TRUE(device_->Copy(window.data(), a.data() + 333, window.size()).ok());
  EXPECT_EQ(window, std::vector<uint8_t>(bytes.begin() + 333, bytes.begin() + 833));
}

TEST_P(DeviceTest, ZerosExactlyTheRangeAsked) {
  std::vector<uint8_t> bytes = RandomBytes(4099);
  for (uint8_t& b : bytes) b |= 1;  // no zero byte before the call
  DeviceMemory memory = OnDevice(bytes);
  ASSERT_TRUE(device_->Zero(memory.data() + 7, 4000).ok());
  std::fill(bytes.begin() + 7, bytes.begin() + 4007, 0);
  EXPECT_EQ(OnHost(memory, bytes.size()), bytes);
}

TEST_P(DeviceTest, AccumulatesAsTheScalarKernelBitForBit) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    for (size_t n : kSizes) {
      std::vector<float> x(n);
      for (float& f : x) f = normal(rng_);
      std::vector<uint8_t> want = RandomValues(dtype, n);
      DeviceMemory acc = OnDevice(want);
      DeviceMemory on_device_x = OnDevice(x);
      for (float scale : {1.0f, 0.37f, 1024.0f}) {
        ASSERT_TRUE(device_
                        ->AccumulateScaled(dtype,
                                           reinterpret_cast<const float*>(on_device_x.data()),
                                           scale, acc.data(), n)
                        .ok());
        ScalarKernels().accumulate_scaled(dtype, x.data(), scale, want.data(), n);
      }
      EXPECT_EQ(OnHost(acc, want.size()), want) << DTypeName(dtype) << " n=" << n;
    }
  }
}

TEST_P(DeviceTest, CastsToFloatAsTheScalarKernelBitForBit) {
  for (DType dtype : {DType::kFp16, DType::kBf16, DType::kFp32}) {
    for (size_t n : kSizes) {
      const std::vector<uint8_t> values = RandomValues(dtype, n);
      std::vector<float> want(n);
      ScalarKernels().cast_to_float(dtype, values.data(), want.data(), n);
      DeviceMemory from = OnDevice(values);
      absl::StatusOr<DeviceMemory> to = device_->Allocate(n * sizeof(float));
      ASSERT_TRUE(to.ok());
      ASSERT_TRUE(
          device_->CastToFloat(dtype, from.data(), reinterpret_cast<float*>(to->data()), n).ok());
      std::vector<uint8_t> got = OnHost(*to, n * sizeof(float));
      std::vector<uint8_t> want_bytes(n * sizeof(float));
      if (n > 0) std::memcpy(want_bytes.data(), want.data(), want_bytes.size());
      EXPECT_EQ(got, want_bytes) << DTypeName(dtype) << " n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceTest, ::testing::Values("cpu", "cuda:0"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "cpu" ? std::string("Host") : std::string("Cuda");
                         });

TEST(OpenDeviceTest, NamesTheDeviceItRefuses) {
  for (const char* name : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda0", "CPU", ""}) {
    absl::StatusOr<std::unique_ptr<Device>> device = OpenDevice(name);
    ASSERT_FALSE(device.ok()) << name;
    EXPECT_TRUE(absl::IsInvalidArgument(device.status())) << name << ": " << device.status();
    EXPECT_NE(device.status().message().find(absl::StrCat("'", name, "'")), std::string::npos)
        << device.status();
  }
  absl::StatusOr<std::unique_ptr<Device>> missing = OpenDevice("cuda:4096");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("cuda:4096"), std::string::npos) << missing.status();
  absl::StatusOr<std::unique_ptr<Device>> host = OpenDevice("cpu");
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE((*host)->is_host());
  EXPECT_EQ((*host)->name(), "cpu");
  EXPECT_EQ((*host)->cuda_ordinal(), -1);
}

}  // namespace
}  // namespace strata
