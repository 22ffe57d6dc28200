#include "tools/bench/server_step_bench.h"

#include <memory>

#include "kernels/isa.h"
#include "tools/bench/server_step_rig.h"

namespace strata {

using nlohmann::json;

absl::StatusOr<json> BenchServerStep(const KernelBenchOptions& o) {
  if (absl::Status s = CheckDtype(o); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<ServerStepRig>> rig = ServerStepRig::Create(o, nullptr);
  if (!rig.ok()) return rig.status();
  absl::StatusOr<json> kernel = BenchAdam(o);
  if (!kernel.ok()) return kernel.status();
  absl::StatusOr<double> step_s = (*rig)->MedianStepSeconds();
  if (!step_s.ok()) return step_s.status();
  double params_per_s = o.num_params / *step_s;
  double kernel_params_per_s = (*kernel)["params_per_s"].get<double>();
  return json{{"bench", "server-step"},
              {"isa", IsaName(ActiveIsa())},
              {"params", o.num_params},
              {"threads", o.threads},
              {"dtype", DTypeName(o.grad_dtype)},
              {"params_per_s", params_per_s},
              {"kernel_params_per_s", kernel_params_per_s},
              {"fraction_of_kernel", params_per_s / kernel_params_per_s},
              {"kernel_fraction_of_bound", (*kernel)["fraction_of_bound"]}};
}

}  // namespace strata
