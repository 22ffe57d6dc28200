// What stratactl prints of copies moved (drain, rebalance) and of
// checkpoints: JSON for --json, else a line or a table. Pure functions.
#ifndef STRATA_TOOLS_CTL_VIEWS_H_
#define STRATA_TOOLS_CTL_VIEWS_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "strata/v1/coordinator.pb.h"
#include "tools/table.h"

namespace strata {

// `out` with what `moved` counts added: jobs, copies, torn, bytes, seconds,
// built_aside, paused_seconds.
nlohmann::json MovedJson(nlohmann::json out, const v1::CopiesMoved& moved);

// One line: the copies moved, their bytes and the pause, then `done`.
std::string MovedLine(const v1::CopiesMoved& moved, const std::string& done);

// The checkpoints as JSON objects (job, step, path, bytes, files,
// created_unix_ms, save_seconds, write_seconds) and as the rows of a table.
nlohmann::json CheckpointsJson(const std::vector<v1::CheckpointInfo>& checkpoints);
Table CheckpointsTable(const std::vector<v1::CheckpointInfo>& checkpoints);

}  // namespace strata

#endif  // STRATA_TOOLS_CTL_VIEWS_H_
