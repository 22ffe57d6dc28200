// ExportModel: a job's master state as a safetensors file, for `stratactl
// export` (loadable by safetensors.torch.load_file).
#ifndef STRATA_TOOLS_MODEL_EXPORT_H_
#define STRATA_TOOLS_MODEL_EXPORT_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "strata/client.h"
#include "strata/flat_layout.h"
#include "strata/v1/common.pb.h"

namespace strata {

struct ExportedModel {
  std::string path;
  size_t num_tensors = 0;
};

// Writes `state` of the job `spec` (laid out by `layout`) to
// DIR/model.safetensors, creating DIR: each tensor by its name, and with
// `with_optimizer_state` NAME.exp_avg and NAME.exp_avg_sq too; metadata
// format=pt, strata_job and strata_step. FAILED_PRECONDITION when DIR
// cannot be made; the writer's error otherwise.
absl::StatusOr<ExportedModel> ExportModel(const v1::JobSpec& spec, const FlatLayout& layout,
                                          const MasterState& state, const std::string& dir,
                                          bool with_optimizer_state);

}  // namespace strata

#endif  // STRATA_TOOLS_MODEL_EXPORT_H_
