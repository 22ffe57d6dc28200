#include "rpc/job_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr uint32_t kMaxWorldSize = 4096;
constexpr uint32_t kMaxReplicas = 3;
constexpr int kMaxTensors = 1 << 20;
constexpr int kMaxParamGroups = 1 << 10;
constexpr size_t kMaxTensorNameBytes = 1024;
constexpr size_t kMaxPathBytes = 4096;

}  // namespace

bool IsValidId(const std::string& id) {
  // "." and ".." would name directories other than the job's in paths.
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP16:
      return DType::kFp16;
    case v1::DTYPE_BF16:
      return DType::kBf16;
    case v1::DTYPE_FP32:
      return DType::kFp32;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not one of fp16, bf16, fp32"));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return v1::DTYPE_FP16;
    case DType::kBf16:
      return v1::DTYPE_BF16;
    case DType::kFp32:
      return v1::DTYPE_FP32;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<StatePrecision> StatePrecisionFromProto(v1::StatePrecision precision) {
  switch (precision) {
    case v1::STATE_PRECISION_UNSPECIFIED:
    case v1::STATE_PRECISION_FP32:
      return StatePrecision::kFp32;
    case v1::STATE_PRECISION_INT8:
      return StatePrecision::kInt8;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "state_precision ", static_cast<int>(precision), " is not one of fp32, int8"));
  }
}

v1::StatePrecision StatePrecisionToProto(StatePrecision precision) {
  return precision == StatePrecision::kInt8 ? v1::STATE_PRECISION_INT8 : v1::STATE_PRECISION_FP32;
}

StatePrecision StatePrecisionOf(const v1::JobSpec& spec) {
  return StatePrecisionFromProto(spec.state_precision()).value_or(StatePrecision::kFp32);
}

AdamConfig AdamFromProto(const v1::AdamConfig& adam) {
  return AdamConfig{adam.lr(),  adam.beta1(),        adam.beta2(),
                    adam.eps(), adam.weight_decay(), adam.adamw()};
}

v1::AdamConfig AdamToProto(const AdamConfig& adam) {
  v1::AdamConfig out;
  out.set_lr(adam.lr);
  out.set_beta1(adam.beta1);
  out.set_beta2(adam.beta2);
  out.set_eps(adam.eps);
  out.set_weight_decay(adam.weight_decay);
  out.set_adamw(adam.adamw);
  return out;
}

LossScaleState LossScaleFromProto(const v1::LossScaleState& state) {
  return LossScaleState{state.scale(), state.good_steps()};
}

v1::LossScaleState LossScaleToProto(const LossScaleState& state) {
  v1::LossScaleState out;
  out.set_scale(state.scale);
  out.set_good_steps(state.good_steps);
  return out;
}

std::vector<TensorSpec> TensorsFromProto(const v1::JobSpec& spec) {
  std::vector<TensorSpec> tensors;
  for (const v1::TensorSpec& t : spec.tensors()) {
    tensors.push_back(TensorSpec{t.name(), {t.shape().begin(), t.shape().end()}, t.group()});
  }
  return tensors;
}

absl::StatusOr<FlatLayout> ValidateJobSpec(const v1::JobSpec& spec) {
  if (!IsValidId(spec.job_id())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id ", Quoted(spec.job_id()), " must be 1 to 128 of [A-Za-z0-9._-], not . or .."));
  }
  if (spec.replicas() > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas ", spec.replicas(), " must be in [1, ", kMaxReplicas, "]"));
  }
  if (spec.world_size() < 1 || spec.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", spec.world_size(), " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (spec.chunk_num_params() > kMaxChunkNumParams) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_num_params ", spec.chunk_num_params(),
                                                   " exceeds the maximum ", kMaxChunkNumParams));
  }
  if (spec.tensors_size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors: ", spec.tensors_size(), " exceed the maximum of ", kMaxTensors));
  }
  if (spec.groups_size() > kMaxParamGroups) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups: ", spec.groups_size(), " exceed the maximum of ", kMaxParamGroups));
  }
  for (int g = 0; g < spec.groups_size(); ++g) {
    const float decay = spec.groups(g).weight_decay();
    if (!std::isfinite(decay) || decay < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("groups[", g, "].weight_decay ", decay, " must be finite and >= 0"));
    }
  }
  const uint32_t num_groups = std::max(spec.groups_size(), 1);
  for (const v1::TensorSpec& t : spec.tensors()) {
    if (t.name().size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name ", Quoted(t.name()), " exceeds ",
                                                     kMaxTensorNameBytes, " bytes"));
    }
    if (t.group() >= num_groups) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(t.name()), "'s group ",
                                                     t.group(), " is not one of the job's ",
                                                     num_groups, " group(s)"));
    }
  }
  if (spec.checkpoint_dir().size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_dir ", Quoted(spec.checkpoint_dir()),
                                                   " exceeds ", kMaxPathBytes, " bytes"));
  }
  RETURN_IF_ERROR(DTypeFromProto(spec.dtype()).status());
  RETURN_IF_ERROR(StatePrecisionFromProto(spec.state_precision()).status());
  const v1::AdamConfig& a = spec.adam();
  if (!std::isfinite(a.lr()) || a.lr() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lr ", a.lr(), " must be finite and >= 0"));
  }
  if (!(a.beta1() >= 0 && a.beta1() < 1) || !(a.beta2() >= 0 && a.beta2() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("betas (", a.beta1(), ", ", a.beta2(), ") must be in [0, 1)"));
  }
  if (!std::isfinite(a.eps()) || a.eps() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("eps ", a.eps(), " must be finite and > 0"));
  }
  if (!std::isfinite(a.weight_decay()) || a.weight_decay() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay ", a.weight_decay(), " must be finite and >= 0"));
  }
  ASSIGN_OR_RETURN(FlatLayout layout,
                   FlatLayout::Create(TensorsFromProto(spec), spec.chunk_num_params()));
  if (layout.num_chunks() > kMaxChunksPerJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_num_params ", spec.chunk_num_params(), " cuts the model's ",
                     layout.num_params(), " parameters into ", layout.num_chunks(),
                     " chunks, more than the maximum of ", kMaxChunksPerJob, " per job"));
  }
  return layout;
}

}  // namespace strata
