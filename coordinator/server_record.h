// ValidateServerRecord: what the coordinator accepts from RegisterServer
// before it stores a shard server, dials it or places chunks on it.
// Stateless.
#ifndef STRATA_COORDINATOR_SERVER_RECORD_H_
#define STRATA_COORDINATOR_SERVER_RECORD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

// The most bytes one tier budget of a server may claim (1 EiB): sums over
// every tier of every server stay far from overflowing 64 bits.
inline constexpr uint64_t kMaxTierBudgetBytes = uint64_t{1} << 60;
inline constexpr size_t kMaxZoneBytes = 64;

// OK when `server.address()` is HOST:PORT (HOST a DNS name, an IPv4 address
// or a bracketed IPv6 one; PORT 1-65535; 255 bytes at most) and each budget
// is at most kMaxTierBudgetBytes, and `server.zone()` is at most
// kMaxZoneBytes of letters, digits, '.', '_' and '-'. Else
// INVALID_ARGUMENT naming the field and quoting its value.
absl::Status ValidateServerRecord(const v1::ServerRecord& server);

}  // namespace strata

#endif  // STRATA_COORDINATOR_SERVER_RECORD_H_
