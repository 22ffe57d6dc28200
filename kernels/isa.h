// Instruction-set variants of the CPU kernels and the choice among them.
// The active variant is chosen once, at run time: the environment variable
// STRATA_KERNEL_ISA (scalar, avx2, avx512) forces one, otherwise the best the
// CPU supports (by CPUID) is used; never by build flags. Thread-safe.
#ifndef STRATA_KERNELS_ISA_H_
#define STRATA_KERNELS_ISA_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* IsaName(Isa isa);
// INVALID_ARGUMENT for a name that is not scalar, avx2 or avx512.
absl::StatusOr<Isa> ParseIsa(absl::string_view name);
// The variants this CPU can run, scalar first.
std::vector<Isa> SupportedIsas();
// The variant the kernels use now.
Isa ActiveIsa();
// Makes `isa` the active variant; FAILED_PRECONDITION when the CPU lacks it.
absl::Status SetActiveIsa(Isa isa);

}  // namespace strata

#endif  // STRATA_KERNELS_ISA_H_
