// Chunk placement: which shard server holds each chunk of a job being created
// or moved. A pure function of the live servers, the chunks other jobs
// already placed on them and the job's chunks; the coordinator calls it under
// its lock and writes the result. Stateless and thread-safe.
//
// Zones (ServerRecord.zone; a server naming none is a zone of its own): of
// the servers a copy may go to, those in a zone that holds no copy of the
// chunk yet come first, so a chunk's copies spread over zones where servers
// with room allow; when none of them has room, a copy shares a zone (never
// a server) with another.
#ifndef STRATA_COORDINATOR_PLACEMENT_H_
#define STRATA_COORDINATOR_PLACEMENT_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

// Bytes of chunks a server can hold: its GPU, host and NVMe budgets (a chunk
// on NVMe keeps one slot). An estimate; the server decides.
uint64_t ServerCapacityBytes(const v1::ServerRecord& server);

// Sets the servers of every chunk of `job` (server_address, then
// JobSpec.replicas - 1 replica_addresses), in chunk order, copy by copy: of
// the servers in `live` that the copy fits on (capacity less the chunks of
// `placed` on it and of the job's copies placed before) and that hold no
// other copy of the chunk, zones first (above), the one with the largest
// fraction of its capacity free takes it, so that servers of about one size
// take turns whatever their budgets' last bytes; ties go to the smallest
// address. Of a chunk's copies, the one on the server with the fewest of
// the job's primary bytes so far becomes the primary (pulls spread too). A
// job in `placed` with `job`'s id is not counted (a move places the job
// anew). FAILED_PRECONDITION when `live` has fewer servers than copies;
// RESOURCE_EXHAUSTED naming the job, its size and the free bytes when a
// chunk fits nowhere (`job` then partly assigned: the caller discards it).
absl::Status PlaceChunks(const std::vector<v1::ServerRecord>& live,
                         const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job);

// Takes the copies on the servers `gone` out of `job`'s chunks; a primary's
// place goes to the chunk's first replica left. A chunk may be left with
// no copy (server_address empty).
void RemoveCopies(const std::set<std::string>& gone, v1::JobInfo* job);

// Gives each chunk of `job` with fewer copies than JobSpec.replicas (at
// least one) more, on the servers of `live` it fits on that hold no copy
// of it, zones first (above), the one with the largest share of its
// capacity free first (every job's copies counted, `job`'s own as it
// stands); a chunk without copies gets its primary, others replicas.
// Returns how many copies it added: a chunk stays short when no server can
// take another copy.
int AddMissingCopies(const std::vector<v1::ServerRecord>& live,
                     const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job);

// Moves copies of `job`'s chunks, one at a time, from the live server with
// the smallest share of its capacity free to the one with the largest that
// holds no copy of the chunk, while the receiver stays freer than the giver
// was (so that every move narrows the spread, as creation balances by
// bytes); no move puts a chunk's copies in fewer zones. A moved primary's
// place goes to the chunk's first replica, or to the new copy. Returns how
// many copies moved.
int RebalanceCopies(const std::vector<v1::ServerRecord>& live,
                    const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job);

}  // namespace strata

#endif  // STRATA_COORDINATOR_PLACEMENT_H_
