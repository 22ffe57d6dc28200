// CreateNcclCollective and NcclDeviceCount where strata is built without the CUDA toolkit.
#include "client/collective.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions&) {
  return absl::FailedPreconditionError(
      "NCCL collective: this build of strata has no CUDA support (toolkit not found)");
}

int NcclDeviceCount() { return 0; }

}  // namespace strata
