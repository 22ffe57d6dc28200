#include "tools/ctl_views.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace strata {

using nlohmann::json;

json MovedJson(json out, const v1::CopiesMoved& moved) {
  out["jobs"] = moved.jobs();
  out["copies"] = moved.copies();
  out["torn"] = moved.torn();
  out["bytes"] = moved.bytes();
  out["seconds"] = moved.seconds();
  out["built_aside"] = moved.prepared();
  out["paused_seconds"] = moved.fenced_seconds();
  out["at_step_boundary"] = moved.at_step_boundary();
  out["boundary_wait_seconds"] = moved.boundary_wait_seconds();
  return out;
}

std::string MovedLine(const v1::CopiesMoved& moved, const std::string& done) {
  return absl::StrFormat(
      "%u chunk copies of %u job(s) moved (%u bytes; %u built while training) in %.2f s, "
      "%u job(s) fenced at a step boundary (%.2f s waited for it), training paused %.2f s; %s",
      moved.copies(), moved.jobs(), moved.bytes(), moved.prepared(), moved.seconds(),
      moved.at_step_boundary(), moved.boundary_wait_seconds(), moved.fenced_seconds(), done);
}

json CheckpointsJson(const std::vector<v1::CheckpointInfo>& checkpoints) {
  json out = json::array();
  for (const v1::CheckpointInfo& c : checkpoints) {
    out.push_back({{"job", c.job_id()},
                   {"step", c.step()},
                   {"path", c.path()},
                   {"bytes", c.num_bytes()},
                   {"files", c.num_files()},
                   {"created_unix_ms", c.created_unix_ms()},
                   {"save_seconds", c.save_seconds()},
                   {"write_seconds", c.write_seconds()}});
  }
  return out;
}

Table CheckpointsTable(const std::vector<v1::CheckpointInfo>& checkpoints) {
  Table table({"JOB", "STEP", "PATH", "BYTES", "FILES", "CREATED", "SAVE_S", "WRITE_S"});
  for (const v1::CheckpointInfo& c : checkpoints) {
    table.Add({c.job_id(), absl::StrCat(c.step()), c.path(), absl::StrCat(c.num_bytes()),
               absl::StrCat(c.num_files()),
               absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(c.created_unix_ms()),
                                absl::LocalTimeZone()),
               absl::StrFormat("%.3f", c.save_seconds()),
               absl::StrFormat("%.3f", c.write_seconds())});
  }
  return table;
}

}  // namespace strata
