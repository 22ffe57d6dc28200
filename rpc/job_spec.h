// Validation of job specs and conversions between the wire types of
// proto/strata/v1 and the value types of strata/types.h. Stateless.
#ifndef STRATA_RPC_JOB_SPEC_H_
#define STRATA_RPC_JOB_SPEC_H_

#include "absl/status/statusor.h"
#include "strata/flat_layout.h"
#include "strata/types.h"
#include "strata/v1/common.pb.h"

namespace strata {

// The largest chunk a job may have, and the most chunks: a job's chunk
// count and a chunk's state bytes (StateBytes) fit every counter with room.
inline constexpr uint64_t kMaxChunkNumParams = uint64_t{64} << 20;
inline constexpr uint32_t kMaxChunksPerJob = 1 << 20;

// The longest reason a RenewGenerationRequest may give (for the log).
inline constexpr size_t kMaxRenewReasonBytes = 1024;

// Whether `id` (a job or worker id) has 1 to 128 of [A-Za-z0-9._-] and is
// not "." or ".." (ids name directories of checkpoints).
bool IsValidId(const std::string& id);

// The layout of a valid spec; INVALID_ARGUMENT naming the first problem:
// job id, tensors (count, names, sizes), world size, chunk size and count,
// checkpoint directory length, optimizer values, dtype or state precision.
absl::StatusOr<FlatLayout> ValidateJobSpec(const v1::JobSpec& spec);

// INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);
v1::DType DTypeToProto(DType dtype);
// UNSPECIFIED is FP32; INVALID_ARGUMENT for an unknown value.
absl::StatusOr<StatePrecision> StatePrecisionFromProto(v1::StatePrecision precision);
v1::StatePrecision StatePrecisionToProto(StatePrecision precision);
// The state precision of a spec ValidateJobSpec() accepted.
StatePrecision StatePrecisionOf(const v1::JobSpec& spec);
AdamConfig AdamFromProto(const v1::AdamConfig& adam);
v1::AdamConfig AdamToProto(const AdamConfig& adam);
LossScaleState LossScaleFromProto(const v1::LossScaleState& state);
v1::LossScaleState LossScaleToProto(const LossScaleState& state);
std::vector<TensorSpec> TensorsFromProto(const v1::JobSpec& spec);

}  // namespace strata

#endif  // STRATA_RPC_JOB_SPEC_H_
