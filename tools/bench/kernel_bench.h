// strata-bench adam | grad-stats | cast: a kernel over N parameters in chunks
// on T threads, and in the same run a memory probe with the kernel's own
// streams (tools/bench/memory_probe.h). Each returns the JSON object to print.
#ifndef STRATA_TOOLS_BENCH_KERNEL_BENCH_H_
#define STRATA_TOOLS_BENCH_KERNEL_BENCH_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "strata/types.h"

namespace strata {

struct KernelBenchOptions {
  size_t num_params = size_t{256} << 20;
  int threads = 2;
  DType grad_dtype = DType::kFp16;
  int reps = 5;
  std::string cast_op = "to_float";  // cast: to_float (fp16 -> fp32) or from_float
  std::string state = "fp32";        // adam, nvme-step, gpu-step: fp32 or int8 (int8_adam.h)
  int grad_binades = 0;              // adam: gradients spread over this many binades (0: none)
};

// `state` as a precision; INVALID_ARGUMENT for another name.
inline absl::StatusOr<StatePrecision> StatePrecisionOf(const KernelBenchOptions& o) {
  if (o.state == "fp32") return StatePrecision::kFp32;
  if (o.state == "int8") return StatePrecision::kInt8;
  return absl::InvalidArgumentError("--state must be fp32 or int8");
}

absl::StatusOr<nlohmann::json> BenchAdam(const KernelBenchOptions& options);
absl::StatusOr<nlohmann::json> BenchGradStats(const KernelBenchOptions& options);
absl::StatusOr<nlohmann::json> BenchCast(const KernelBenchOptions& options);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_KERNEL_BENCH_H_
