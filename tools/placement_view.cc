#include "tools/placement_view.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {

PlacementView::PlacementView()
    : rows_json_(nlohmann::json::array()),
      rows_({"JOB", "CHUNK", "COPY", "FLAT_RANGE", "TENSORS", "SERVER", "TIER", "BYTES", "STEP"}) {}

void PlacementView::Add(const v1::GetPlacementResponse& placement) {
  for (const v1::ServerRecord& server : placement.servers()) {
    zone_of_[server.address()] = server.zone();
    if (server.gpu_budget_bytes() > 0) {
      use_[{server.address(), "gpu"}].budget_bytes = server.gpu_budget_bytes();
    }
    use_[{server.address(), "host"}].budget_bytes = server.host_budget_bytes();
    if (server.nvme_budget_bytes() > 0) {
      use_[{server.address(), "nvme"}].budget_bytes = server.nvme_budget_bytes();
    }
  }
  for (const v1::PlacementRow& r : placement.rows()) {
    std::vector<std::string> tensors(r.tensors().begin(), r.tensors().end());
    rows_json_.push_back({{"job", r.job_id()},
                          {"chunk", r.chunk_id()},
                          {"copy", r.copy()},
                          {"serves_pulls", r.copy() == 0},
                          {"flat_begin", r.flat_begin()},
                          {"num_params", r.num_params()},
                          {"tensors", tensors},
                          {"server", r.server_address()},
                          {"zone", zone_of_[r.server_address()]},
                          {"tier", r.tier()},
                          {"bytes", r.num_bytes()},
                          {"applied_step", r.applied_step()}});
    rows_.Add({r.job_id(), absl::StrCat(r.chunk_id()),
               r.copy() == 0 ? "primary" : absl::StrCat("replica ", r.copy()),
               absl::StrCat("[", r.flat_begin(), ", ", r.flat_begin() + r.num_params(), ")"),
               absl::StrJoin(tensors, ","), r.server_address(), r.tier(),
               absl::StrCat(r.num_bytes()), absl::StrCat(r.applied_step())});
    TierUse& use = use_[{r.server_address(), r.tier()}];
    use.bytes += r.num_bytes();
    ++use.chunks;
  }
}

void PlacementView::Print(FILE* out) const {
  rows_.Print(out);
  std::fprintf(out, "\n");
  Table totals({"SERVER", "ZONE", "TIER", "CHUNKS", "BYTES", "BUDGET"});
  for (const auto& [key, use] : use_) {
    auto zone = zone_of_.find(key.first);
    totals.Add({key.first, zone == zone_of_.end() || zone->second.empty() ? "-" : zone->second,
                key.second, absl::StrCat(use.chunks), absl::StrCat(use.bytes),
                absl::StrCat(use.budget_bytes)});
  }
  totals.Print(out);
}

}  // namespace strata
