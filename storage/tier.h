// A Tier stores chunk extents in one class of memory (GPU, pinned host, NVMe)
// within a byte budget that it never exceeds. All methods are thread-safe.
// Reads and writes complete through `done`, on an I/O thread of the tier or
// inline; `done` must not block, and the buffer must stay valid until then.
// A range outside its extent is OUT_OF_RANGE; what a tier reads back of bytes
// never written since Allocate is tier-specific (the host tier gives zeros).
// Tiers with alignment rules (NVMe: 4 KiB offsets, sizes and buffers) refuse
// others with INVALID_ARGUMENT.
#ifndef STRATA_STORAGE_TIER_H_
#define STRATA_STORAGE_TIER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace strata {

enum class TierKind { kGpu, kHost, kNvme };

const char* TierKindName(TierKind kind);

// A reserved region of a tier. `id` is unique within the tier.
struct Extent {
  uint64_t id = 0;
  uint64_t offset = 0;
  uint64_t num_bytes = 0;
};

using IoDone = absl::AnyInvocable<void(absl::Status) &&>;

class Tier {
 public:
  virtual ~Tier() = default;
  virtual TierKind kind() const = 0;
  virtual uint64_t budget_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  // Memory of freed extents the tier keeps for new ones (within the budget
  // with used_bytes(); the host tier's, see host_tier.h).
  virtual uint64_t kept_bytes() const { return 0; }
  // Reserves `num_bytes` within the budget; RESOURCE_EXHAUSTED when it does not fit.
  virtual absl::StatusOr<Extent> Allocate(uint64_t num_bytes) = 0;
  // The same for an extent about to be written whole (a restore's load): a
  // tier may leave its memory to be faulted in by those writes, alongside
  // them, and unpinned until Settle. Until then the extent reads as
  // Allocate's would.
  virtual absl::StatusOr<Extent> AllocateToFill(uint64_t num_bytes) { return Allocate(num_bytes); }
  // Makes an extent from AllocateToFill what Allocate's are (page-locked where
  // the tier pins); the tier's refusal (RESOURCE_EXHAUSTED) leaves it as it was.
  // Once settled, a call does nothing.
  virtual absl::Status Settle(const Extent&) { return absl::OkStatus(); }
  // Returns an extent's bytes to the budget.
  virtual void Free(const Extent& extent) = 0;
  virtual void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) = 0;
  virtual void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
                     IoDone done) = 0;
  // The extent's bytes in this process's address space, for tiers that are
  // memory the CPU can address; nullptr for tiers that are not (NVMe, GPU).
  virtual std::byte* Map(const Extent& extent) = 0;
  // The extent's address in GPU memory, for tiers in a GPU's memory (whose
  // kernels then work on it in place); nullptr for others.
  virtual std::byte* DeviceAddress(const Extent&) { return nullptr; }
  // The per-block checksums of a wholly written extent, for tiers that keep
  // them (NVMe), to be recorded for a restart; UNIMPLEMENTED for others.
  virtual absl::StatusOr<std::vector<uint64_t>> Checksums(const Extent&) const {
    return absl::UnimplementedError("this tier keeps no checksums");
  }
};

// The refusals every tier gives, its name ("host tier") first.
// RESOURCE_EXHAUSTED: `num_bytes` do not fit beside `used_bytes` of `budget_bytes`.
absl::Status BudgetExceeded(absl::string_view tier, uint64_t num_bytes, uint64_t used_bytes,
                            uint64_t budget_bytes);
// `num_bytes` rounded up to a multiple of `alignment` (a power of two) when
// that fits beside `used_bytes` of `budget_bytes`, else BudgetExceeded (sizes
// are compared before they are rounded, so no size wraps).
absl::StatusOr<uint64_t> RoundUpInBudget(absl::string_view tier, uint64_t num_bytes,
                                         uint64_t alignment, uint64_t used_bytes,
                                         uint64_t budget_bytes);
// OK when [offset, offset + num_bytes) lies in extent `extent_id` of
// `extent_bytes`; OUT_OF_RANGE naming both otherwise.
absl::Status CheckRange(absl::string_view tier, uint64_t extent_id, uint64_t extent_bytes,
                        uint64_t offset, uint64_t num_bytes);

// Synchronous forms of Tier::Read and Tier::Write: they wait for `done`.
// For callers that may block (step executor threads, tests), never reactors.
absl::Status ReadAndWait(Tier& tier, const Extent& from, uint64_t offset, absl::Span<std::byte> to);
absl::Status WriteAndWait(Tier& tier, const Extent& to, uint64_t offset,
                          absl::Span<const std::byte> from);

}  // namespace strata

#endif  // STRATA_STORAGE_TIER_H_
