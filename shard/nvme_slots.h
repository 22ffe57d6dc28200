// NvmeSlots: the NVMe tier's extents for chunk states, one slot per state,
// written copy-on-write: a commit writes a new slot, and the old one is
// freed once the chunk's record names the new one (a failed or torn write
// leaves the previous state intact, as two fixed slots per state did, at
// half their space). At most `spares` commits hold a second slot at once,
// further ones wait; new states are allocated only while the tier keeps room
// for that many slots of its largest state's size, so that a commit finds
// room for its slot (unless the tier's free space is cut into pieces too
// small for it: RESOURCE_EXHAUSTED, the state unchanged).
//
// The tier's every allocation goes through one NvmeSlots. Thread-safe.
#ifndef STRATA_SHARD_NVME_SLOTS_H_
#define STRATA_SHARD_NVME_SLOTS_H_

#include <cstdint>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/tier.h"

namespace strata {

class NvmeSlots {
 public:
  NvmeSlots(Tier* nvme, int spares);
  NvmeSlots(const NvmeSlots&) = delete;
  NvmeSlots& operator=(const NvmeSlots&) = delete;

  Tier* tier() const { return nvme_; }
  int spares() const { return spares_; }

  // The slot of a new state. RESOURCE_EXHAUSTED when, with it, the tier
  // would keep less than `spares` slots of the largest state's size free.
  absl::StatusOr<Extent> Allocate(uint64_t slot_bytes);
  // Counts `slot` (the tier's, adopted after a restart) as a state's slot.
  void Adopted(const Extent& slot);
  // Frees a state's slot (its state is gone).
  void Free(const Extent& slot);

  // The new slot of a commit of a state whose slots take `slot_bytes`;
  // waits while `spares` commits hold one. RESOURCE_EXHAUSTED when the tier
  // has no such extent free.
  absl::StatusOr<Extent> BeginCommit(uint64_t slot_bytes);
  // Ends a commit that BeginCommit began: `unused` is the slot no state
  // keeps (the old one, or the new one of a failed commit).
  void EndCommit(const Extent& unused);

 private:
  // Bytes the spares need: `spares_` slots as large as the largest state's,
  // counting one of `with_slot_bytes`.
  uint64_t SpareBytes(uint64_t with_slot_bytes) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool SpareFree() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return commits_ < spares_; }

  Tier* const nvme_;
  const int spares_;
  mutable absl::Mutex mu_;
  std::multiset<uint64_t> state_slot_bytes_ ABSL_GUARDED_BY(mu_);
  int commits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t commit_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // their new slots
};

}  // namespace strata

#endif  // STRATA_SHARD_NVME_SLOTS_H_
