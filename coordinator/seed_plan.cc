#include "coordinator/seed_plan.h"

#include "absl/strings/str_cat.h"
#include "coordinator/job_info.h"

namespace strata {
namespace {

bool SameRound(const v1::ChunkStatus& a, const v1::ChunkStatus& b) {
  if (!a.has_applied_round() || !b.has_applied_round()) return true;
  return a.applied_round().generation() == b.applied_round().generation() &&
         a.applied_round().attempt() == b.applied_round().attempt();
}

}  // namespace

std::string SeedSourceOf(const v1::ChunkAssignment& chunk, const IsLost& is_lost) {
  for (const std::string& address : CopiesOf(chunk)) {
    if (!is_lost(address)) return address;
  }
  return "";
}

ChunksByServer NewCopies(const v1::JobInfo& before, const v1::JobInfo& after) {
  ChunksByServer copies;
  for (int i = 0; i < after.chunks_size(); ++i) {
    for (const std::string& target : CopiesOf(after.chunks(i))) {
      if (!HoldsCopy(before.chunks(i), target)) {
        copies[target].push_back(after.chunks(i).chunk().chunk_id());
      }
    }
  }
  return copies;
}

absl::StatusOr<SeedPlan> PlanSeeds(const v1::JobInfo& before, const v1::JobInfo& after,
                                   const IsLost& is_lost) {
  SeedPlan plan;
  for (int i = 0; i < after.chunks_size(); ++i) {
    const v1::ChunkAssignment& old = before.chunks(i);
    const std::string source = SeedSourceOf(old, is_lost);
    for (const std::string& target : CopiesOf(after.chunks(i))) {
      if (HoldsCopy(old, target)) continue;
      if (source.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "chunk ", old.chunk().chunk_id(), " has no live copy to seed ", target, " from"));
      }
      plan[{target, source}].push_back(old.chunk());
    }
  }
  return plan;
}

TornCopies FindTornCopies(const v1::JobInfo& before, const v1::JobInfo& after,
                          const std::map<std::string, std::vector<v1::ChunkStatus>>& statuses,
                          const IsLost& is_lost) {
  // chunk id -> server -> its row.
  std::map<uint32_t, std::map<std::string, const v1::ChunkStatus*>> rows;
  for (const auto& [address, chunks] : statuses) {
    for (const v1::ChunkStatus& c : chunks) rows[c.chunk().chunk_id()][address] = &c;
  }
  TornCopies torn;
  for (int i = 0; i < before.chunks_size(); ++i) {
    const v1::ChunkAssignment& old = before.chunks(i);
    const std::string source = SeedSourceOf(old, is_lost);
    const auto& copies = rows[old.chunk().chunk_id()];
    auto source_row = copies.find(source);
    if (source_row == copies.end()) continue;
    const v1::ChunkStatus& reference = *source_row->second;
    for (const std::string& address : CopiesOf(old)) {
      if (address == source || is_lost(address) || !HoldsCopy(after.chunks(i), address)) continue;
      auto row = copies.find(address);
      if (row == copies.end()) continue;
      if (row->second->applied_step() == reference.applied_step() &&
          SameRound(*row->second, reference)) {
        continue;
      }
      torn.by_server[address].push_back(old.chunk().chunk_id());
      torn.plan[{address, source}].push_back(old.chunk());
    }
  }
  return torn;
}

}  // namespace strata
