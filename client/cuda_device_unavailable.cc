// OpenCudaDevice() where strata is built without the CUDA toolkit.
#include "absl/strings/str_cat.h"
#include "client/device.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal) {
  return absl::FailedPreconditionError(absl::StrCat(
      "device cuda:", ordinal, ": this build of strata has no CUDA (the toolkit was not found)"));
}

}  // namespace strata
