// Seed plans: which server seeds which chunk copy from which, when a job's
// copies move (coordinator/copy_mover.cc). New copies are seeded from the
// chunk's first old copy on a live server (its source). So are old copies
// that a cut-short step left apart from the source -- torn copies: a worker
// lost between its pushes to a chunk's copies, or a server lost mid-step,
// leaves one copy a step ahead of another, or both at a step applied by
// different rounds of pushes; the copies then hold different states, and
// the job's next step would only drive them further apart.
//
// Pure functions; thread-compatible.
#ifndef STRATA_COORDINATOR_SEED_PLAN_H_
#define STRATA_COORDINATOR_SEED_PLAN_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/v1/coordinator.pb.h"
#include "strata/v1/shard.pb.h"

namespace strata {

// The chunks each (target, source) pair of servers seeds.
using SeedPlan = std::map<std::pair<std::string, std::string>, std::vector<v1::ChunkSpec>>;
// Chunk ids by server.
using ChunksByServer = std::map<std::string, std::vector<uint32_t>>;
using IsLost = std::function<bool(const std::string& address)>;

// The first copy of `chunk` on a live server; empty when none is.
std::string SeedSourceOf(const v1::ChunkAssignment& chunk, const IsLost& is_lost);

// The new copies of `after` (those of `before`'s chunks it did not hold) by
// server: they start empty, also on a server that holds a stale one.
ChunksByServer NewCopies(const v1::JobInfo& before, const v1::JobInfo& after);

// The new copies of `after` by (target, source). FAILED_PRECONDITION naming a chunk with no live
// copy.
absl::StatusOr<SeedPlan> PlanSeeds(const v1::JobInfo& before, const v1::JobInfo& after,
                                   const IsLost& is_lost);

// The copies of `before` that `after` keeps and that differ from their
// chunk's source (`statuses`: each live server's ListChunks rows of the
// job, the job fenced): at another step, or at the same step applied by
// another round (a copy whose state was written rather than applied
// matches any round). A copy or source without a row is not judged.
struct TornCopies {
  ChunksByServer by_server;  // to be made anew
  SeedPlan plan;             // each from its chunk's source
};
TornCopies FindTornCopies(const v1::JobInfo& before, const v1::JobInfo& after,
                          const std::map<std::string, std::vector<v1::ChunkStatus>>& statuses,
                          const IsLost& is_lost);

}  // namespace strata

#endif  // STRATA_COORDINATOR_SEED_PLAN_H_
