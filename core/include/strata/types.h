// Plain value types shared by the strata client API and the services:
// element types, tensor specs and optimizer hyper-parameters.
// Values only; no thread-safety concerns.
#ifndef STRATA_TYPES_H_
#define STRATA_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// Element type of gradients on the wire and of the parameters workers hold.
enum class DType : int { kFp16 = 1, kBf16 = 2, kFp32 = 3 };

constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kFp32 ? 4 : 2; }

inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return "fp16";
    case DType::kBf16:
      return "bf16";
    case DType::kFp32:
      return "fp32";
  }
  return "unknown";
}

// How a job's shard servers store the Adam moments m and v: FP32, or 8-bit
// codes with one FP32 scale per block (kernels/int8_adam.h). p is FP32 in
// both.
enum class StatePrecision : int { kFp32 = 1, kInt8 = 2 };

inline const char* StatePrecisionName(StatePrecision precision) {
  return precision == StatePrecision::kInt8 ? "int8" : "fp32";
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t group = 0;  // its parameter group (JobOptions::groups)
};

// A parameter group's own hyper-parameters (torch's param_groups).
struct ParamGroup {
  float weight_decay = 0.0f;
};

// AdamW when `adamw` (decoupled weight decay), else Adam with L2 in the gradient.
struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;
};

// A dynamic loss scaler's state: the scale, and the good steps in a row
// since it last changed.
struct LossScaleState {
  float scale = 0.0f;
  int32_t good_steps = 0;
};

}  // namespace strata

#endif  // STRATA_TYPES_H_
