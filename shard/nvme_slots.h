// NvmeSlots: the NVMe tier's extents for chunk states, one slot per state,
// written copy-on-write: a commit writes a spare slot of the state's size
// and makes it current, and the old slot becomes that spare once the
// chunk's record names the new one (a failed or torn write leaves the
// previous state intact, and its new slot goes back).
//
// Each slot size in use keeps min(spares, its states) spares, allocated
// with the states (a state the tier has no room for beside its spare is
// refused when it is placed, RESOURCE_EXHAUSTED) and freed with them. So a
// commit never allocates: however the tier's free space is cut, it finds
// its slot; it waits only while commits of states of its size hold every
// spare. States adopted after a restart come back without spares (their
// slots are taken back one by one, and a spare could take the place of one
// not yet adopted): the next new state, or else a state's first commit,
// allocates them first (a commit finding no room is RESOURCE_EXHAUSTED, its
// state unchanged).
//
// The tier's every allocation goes through one NvmeSlots. Thread-safe.
#ifndef STRATA_SHARD_NVME_SLOTS_H_
#define STRATA_SHARD_NVME_SLOTS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/tier.h"

namespace strata {

class NvmeSlots {
 public:
  // `spares`: at most this many commits of states of one size at once (a
  // job's staging buffers).
  NvmeSlots(Tier* nvme, int spares);
  NvmeSlots(const NvmeSlots&) = delete;
  NvmeSlots& operator=(const NvmeSlots&) = delete;

  Tier* tier() const { return nvme_; }
  int spares() const { return spares_; }

  // The slot of a new state of `slot_bytes`, and a spare of that size where
  // its size keeps fewer than it needs. RESOURCE_EXHAUSTED, nothing taken,
  // when the tier has no room for them.
  absl::StatusOr<Extent> Allocate(uint64_t slot_bytes);
  // Counts `slot` (the tier's, adopted after a restart) as a state's slot.
  void Adopted(const Extent& slot);
  // Frees a state's slot (its state is gone), and a spare its size no
  // longer needs.
  void Free(const Extent& slot);

  // The new slot of a commit of a state whose slot takes `slot_bytes`: a
  // spare of that size. Waits while other commits hold every spare of it.
  absl::StatusOr<Extent> BeginCommit(uint64_t slot_bytes);
  // Ends a commit that BeginCommit began: `unused` is the slot no state
  // keeps (the old one, or the new one of a failed commit); it becomes a
  // spare of its size.
  void EndCommit(const Extent& unused);

 private:
  // The slots of one size.
  struct Size {
    int states = 0;
    std::vector<Extent> free_spares;
    int committing = 0;  // spares that commits hold
    int spares() const { return static_cast<int>(free_spares.size()) + committing; }
  };

  int SparesWanted(const Size& size) const { return std::min(spares_, size.states); }
  // Allocates the spares that sizes of adopted states lack.
  absl::Status MakeMissingSpares() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees spares of `slot_bytes` beyond those its states want, and forgets
  // a size with no slot left.
  void Trim(uint64_t slot_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Tier* const nvme_;
  const int spares_;
  absl::Mutex mu_;
  std::map<uint64_t, Size> sizes_ ABSL_GUARDED_BY(mu_);  // by slot bytes
};

}  // namespace strata

#endif  // STRATA_SHARD_NVME_SLOTS_H_
