// MakeKernelTable<Ops>(): every CPU kernel instantiated for one
// instruction-set variant. Each variant's translation unit (scalar.cc,
// avx2.cc, avx512.cc) includes this once. Internal to kernels/.
#ifndef STRATA_KERNELS_CPU_MAKE_KERNEL_TABLE_H_
#define STRATA_KERNELS_CPU_MAKE_KERNEL_TABLE_H_

#include "kernels/cpu/int8_adam_impl.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kernels_impl.h"

namespace strata {
namespace kernels_internal {
namespace {

template <typename Ops>
Int8KernelTable MakeInt8KernelTable() {
  return Int8KernelTable{&AdamUpdateInt8Impl<Ops>, &QuantizeMomentsImpl<Ops>,
                         &DequantizeMomentsImpl<Ops>};
}

// The kernels of Ops, with the 8-bit-state kernels of `int8` (by default
// those of Ops too).
template <typename Ops>
KernelTable MakeKernelTable(Isa isa, Int8KernelTable int8 = MakeInt8KernelTable<Ops>()) {
  return KernelTable{isa,
                     &AdamUpdateImpl<Ops>,
                     &GradStatsImpl<Ops>,
                     &CastFromFloatImpl<Ops>,
                     &CastToFloatImpl<Ops>,
                     &AccumulateScaledImpl<Ops>,
                     &AddInPlaceImpl<Ops>,
                     int8};
}

}  // namespace
}  // namespace kernels_internal
}  // namespace strata

#endif  // STRATA_KERNELS_CPU_MAKE_KERNEL_TABLE_H_
