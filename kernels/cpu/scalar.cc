// The scalar variant: the reference every other variant must match bit for bit.
#include "kernels/cpu/make_kernel_table.h"

namespace strata {

const KernelTable& ScalarKernels() {
  static const KernelTable table =
      kernels_internal::MakeKernelTable<kernels_internal::ScalarOps>(Isa::kScalar);
  return table;
}

}  // namespace strata
