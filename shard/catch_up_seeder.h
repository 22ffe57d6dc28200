// Building new copies of chunks aside while their job trains (SeedChunks
// with prepare) and finishing them once the job is fenced: a shard server
// reads each chunk's state from the source in pieces (ReadState, after
// starting the chunk's step log there: ReadStepLog with start), and
// brings each piece to the source's step by replaying the steps logged
// since (ReadStepLog), into a CatchUpCopy. Blocking; thread-safe for
// distinct copies.
#ifndef STRATA_SHARD_CATCH_UP_SEEDER_H_
#define STRATA_SHARD_CATCH_UP_SEEDER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shard/catch_up_copy.h"
#include "shard/chunk_seeder.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

// Starts `copy`'s chunk's step log at the source, then reads every piece
// (at the step the source has then, each). The source's error, naming it.
absl::Status ReadPieces(const SeedSource& source, CatchUpCopy* copy);
// Replays on every piece the steps the source logged after it; with
// `to_applied_step` (a fenced source), until every piece is at the step
// the chunk applied there. Returns the steps replayed (the chunk's: summed
// over pieces, divided by their number); the source's error, naming it, or
// ABORTED when the log lacks a step a piece needs (it began anew).
absl::StatusOr<uint64_t> CatchUp(const SeedSource& source, CatchUpCopy* copy, bool to_applied_step);
// Pulls from the source each piece's copy of the step before that it does
// not keep (the source keeps it while fenced at the copy's step; ABORTED:
// it does not, and the copy goes without).
absl::Status PullPrevious(const SeedSource& source, CatchUpCopy* copy);
// Ends the chunk's step log at the source; errors are ignored (the log ends
// by itself when nobody reads it).
void EndStepLog(const SeedSource& source, const CatchUpCopy& copy);

}  // namespace strata

#endif  // STRATA_SHARD_CATCH_UP_SEEDER_H_
