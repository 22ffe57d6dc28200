// AgreeOnNewestGeneration: how the workers of a group, told that a newer
// generation of their job exists, agree on which one to follow. Each
// worker's watch stream brings generations at its own pace, so at a given
// moment one worker may know generation N+1 and another N+2 already.
//
// Each round, every worker marks the generation it has heard of last (its
// distance from the group's generation) in a vector that one all-reduce
// sums; a worker behind the newest marked then waits (`hear_wait` at most)
// to hear of it, and the group tries again, until every worker marks the
// same one. Every worker of the group calls it together, and all return
// the same: the generation every worker heard of last, or nullopt (re-form
// instead) after kAgreeRounds rounds without agreement or where a
// generation kAgreeSlots or more ahead of the group's was heard of.
//
// A function of its arguments: thread-compatible.
#ifndef STRATA_CLIENT_GENERATION_AGREEMENT_H_
#define STRATA_CLIENT_GENERATION_AGREEMENT_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

inline constexpr int kAgreeRounds = 3;
inline constexpr uint64_t kAgreeSlots = 16;

// `latest` is the newest generation this worker has heard of;
// `wait_to_hear(number, deadline)` waits until it has heard of `number` or
// a newer one, or until `deadline`; `all_reduce_sum` is the group's
// all-reduce. Errors are the all-reduce's.
absl::StatusOr<std::optional<v1::Generation>> AgreeOnNewestGeneration(
    uint64_t group_generation, uint32_t world_size, absl::Duration hear_wait, absl::Time deadline,
    absl::FunctionRef<v1::Generation()> latest,
    absl::FunctionRef<void(uint64_t number, absl::Time deadline)> wait_to_hear,
    absl::FunctionRef<absl::Status(absl::Span<double> values)> all_reduce_sum);

}  // namespace strata

#endif  // STRATA_CLIENT_GENERATION_AGREEMENT_H_
