#include "tools/model_export.h"

#include <cstdint>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/safetensors.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<ExportedModel> ExportModel(const v1::JobSpec& spec, const FlatLayout& layout,
                                          const MasterState& state, const std::string& dir,
                                          bool with_optimizer_state) {
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const v1::TensorSpec& tensor = spec.tensors(i);
    std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    const uint64_t begin = layout.tensor_range(i).begin;
    tensors.push_back({tensor.name(), shape, &state.params[begin]});
    if (with_optimizer_state) {
      tensors.push_back({tensor.name() + ".exp_avg", shape, &state.exp_avg[begin]});
      tensors.push_back({tensor.name() + ".exp_avg_sq", shape, &state.exp_avg_sq[begin]});
    }
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir, ": ", error.message()));
  }
  ExportedModel exported{dir + "/model.safetensors", tensors.size()};
  RETURN_IF_ERROR(WriteSafetensors(exported.path, tensors,
                                   {{"format", "pt"},
                                    {"strata_job", spec.job_id()},
                                    {"strata_step", absl::StrCat(state.step)}}));
  return exported;
}

}  // namespace strata
