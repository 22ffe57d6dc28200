// PlacementView: jobs' placements (GetPlacement answers) as stratactl shows
// them: one JSON object per chunk copy, a table of the same rows, and a table
// of what each server holds in each tier against its budget. Not
// thread-safe.
#ifndef STRATA_TOOLS_PLACEMENT_VIEW_H_
#define STRATA_TOOLS_PLACEMENT_VIEW_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "nlohmann/json.hpp"
#include "strata/v1/coordinator.pb.h"
#include "tools/table.h"

namespace strata {

class PlacementView {
 public:
  PlacementView();
  // Adds the rows and servers of one job's placement.
  void Add(const v1::GetPlacementResponse& placement);
  // Every row added: job, chunk, copy, serves_pulls, flat_begin, num_params,
  // tensors, server, zone, tier, bytes, applied_step.
  const nlohmann::json& rows_json() const { return rows_json_; }
  // The rows, a blank line, then per (server, tier): zone, chunks, bytes, budget.
  void Print(FILE* out) const;

 private:
  struct TierUse {
    uint64_t bytes = 0;
    int chunks = 0;
    uint64_t budget_bytes = 0;
  };
  nlohmann::json rows_json_;
  Table rows_;
  std::map<std::pair<std::string, std::string>, TierUse> use_;  // by (server, tier)
  std::map<std::string, std::string> zone_of_;                  // server -> zone ("": its own)
};

}  // namespace strata

#endif  // STRATA_TOOLS_PLACEMENT_VIEW_H_
