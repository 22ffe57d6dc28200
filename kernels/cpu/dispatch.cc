// Run-time choice of the kernel variant (isa.h) and the public kernel
// functions, which forward to the active variant's table.
#include <cpuid.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/adam.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/elementwise.h"
#include "kernels/grad_stats.h"
#include "kernels/int8_adam.h"
#include "kernels/isa.h"

namespace strata {
namespace {

// F16C (CPUID leaf 1, ECX bit 29), read directly: clang's
// __builtin_cpu_supports does not know the feature.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool CpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && HasF16c() && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bf16") && HasF16c();
  }
  return false;
}

// STRATA_KERNEL_ISA when set and usable, else the best the CPU supports.
const KernelTable* InitialTable() {
  Isa best = SupportedIsas().back();
  const char* forced = std::getenv("STRATA_KERNEL_ISA");
  if (forced == nullptr || *forced == '\0') return &KernelsFor(best);
  absl::StatusOr<Isa> isa = ParseIsa(forced);
  if (!isa.ok() || !CpuSupports(*isa)) {
    std::fprintf(stderr, "strata: ignoring STRATA_KERNEL_ISA=%s (%s); using %s\n", forced,
                 isa.ok() ? "not supported by this CPU" : "unknown", IsaName(best));
    return &KernelsFor(best);
  }
  return &KernelsFor(*isa);
}

std::atomic<const KernelTable*> active_table{nullptr};

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<Isa> ParseIsa(absl::string_view name) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name == IsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown instruction set '", name, "': use scalar, avx2 or avx512"));
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

const KernelTable& KernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return Avx2Kernels();
    case Isa::kAvx512:
      return Avx512Kernels();
    case Isa::kScalar:
      break;
  }
  return ScalarKernels();
}

const KernelTable& ActiveKernels() {
  const KernelTable* table = active_table.load(std::memory_order_acquire);
  if (table == nullptr) {
    const KernelTable* initial = InitialTable();
    // A racing thread may have set it first; both chose the same way.
    active_table.compare_exchange_strong(table, initial, std::memory_order_acq_rel);
    table = active_table.load(std::memory_order_acquire);
  }
  return *table;
}

Isa ActiveIsa() { return ActiveKernels().isa; }

absl::Status SetActiveIsa(Isa isa) {
  if (!CpuSupports(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU does not support the ", IsaName(isa), " kernels"));
  }
  active_table.store(&KernelsFor(isa), std::memory_order_release);
  return absl::OkStatus();
}

void AdamUpdate(const AdamConstants& c, DType grad_dtype, const void* grads, AdamInputs in,
                AdamOutputs out, DType copy_dtype, void* copy, size_t n) {
  ActiveKernels().adam_update(c, grad_dtype, grads, in, out, copy_dtype, copy, n);
}

GradStats ComputeGradStats(DType dtype, const void* grads, size_t n) {
  return ActiveKernels().grad_stats(dtype, grads, n);
}

void CastFromFloat(const float* from, DType dtype, void* to, size_t n) {
  ActiveKernels().cast_from_float(from, dtype, to, n);
}

void CastToFloat(DType dtype, const void* from, float* to, size_t n) {
  ActiveKernels().cast_to_float(dtype, from, to, n);
}

void AccumulateScaled(DType dtype, const float* x, float scale, void* acc, size_t n) {
  ActiveKernels().accumulate_scaled(dtype, x, scale, acc, n);
}

void AddInPlace(DType dtype, const void* x, void* acc, size_t n) {
  ActiveKernels().add_in_place(dtype, x, acc, n);
}

void AdamUpdateInt8(const AdamConstants& c, DType grad_dtype, const void* grads, float* p,
                    Int8Moments moments, Int8Rounding rounding, DType copy_dtype, void* copy,
                    size_t n) {
  ActiveKernels().int8.adam_update(c, grad_dtype, grads, p, moments, rounding, copy_dtype, copy, n);
}

void QuantizeMoments(const float* m, const float* v, Int8Moments out, size_t n) {
  ActiveKernels().int8.quantize_moments(m, v, out, /*rounding=*/nullptr, n);
}

void QuantizeMomentsRounded(const float* m, const float* v, Int8Moments out, Int8Rounding rounding,
                            size_t n) {
  ActiveKernels().int8.quantize_moments(m, v, out, &rounding, n);
}

void DequantizeMoments(const Int8Moments& in, float* m, float* v, size_t n) {
  ActiveKernels().int8.dequantize_moments(in, m, v, n);
}

}  // namespace strata
