#include "shard/nvme_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

NvmeSlots::NvmeSlots(Tier* nvme, int spares) : nvme_(nvme), spares_(std::max(spares, 1)) {}

uint64_t NvmeSlots::SpareBytes(uint64_t with_slot_bytes) const {
  const uint64_t largest = state_slot_bytes_.empty() ? 0 : *std::prev(state_slot_bytes_.end());
  return static_cast<uint64_t>(spares_) * std::max(largest, with_slot_bytes);
}

absl::StatusOr<Extent> NvmeSlots::Allocate(uint64_t slot_bytes) {
  absl::MutexLock lock(&mu_);
  // The commits' new slots are the spares' room, taken for a moment.
  const uint64_t states_bytes = nvme_->used_bytes() - commit_bytes_;
  const uint64_t budget = nvme_->budget_bytes();
  const uint64_t spare_bytes = SpareBytes(slot_bytes);
  if (states_bytes > budget || budget - states_bytes < slot_bytes ||
      budget - states_bytes - slot_bytes < spare_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("NVMe tier: a state's slot of ", slot_bytes, " bytes does not fit beside ",
                     states_bytes, " bytes of states and room for ", spares_,
                     " commits' new slots (", spare_bytes, " bytes) in the budget of ", budget));
  }
  absl::StatusOr<Extent> slot = nvme_->Allocate(slot_bytes);
  if (slot.ok()) state_slot_bytes_.insert(slot_bytes);
  return slot;
}

void NvmeSlots::Adopted(const Extent& slot) {
  absl::MutexLock lock(&mu_);
  state_slot_bytes_.insert(slot.num_bytes);
}

void NvmeSlots::Free(const Extent& slot) {
  nvme_->Free(slot);
  absl::MutexLock lock(&mu_);
  if (auto it = state_slot_bytes_.find(slot.num_bytes); it != state_slot_bytes_.end()) {
    state_slot_bytes_.erase(it);
  }
}

absl::StatusOr<Extent> NvmeSlots::BeginCommit(uint64_t slot_bytes) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &NvmeSlots::SpareFree));
  absl::StatusOr<Extent> slot = nvme_->Allocate(slot_bytes);
  if (!slot.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("NVMe tier: no free extent of ", slot_bytes,
                     " bytes for a commit's new slot: ", slot.status().message()));
  }
  ++commits_;
  commit_bytes_ += slot->num_bytes;
  return slot;
}

void NvmeSlots::EndCommit(const Extent& unused) {
  absl::MutexLock lock(&mu_);
  nvme_->Free(unused);
  --commits_;
  commit_bytes_ -= unused.num_bytes;
}

}  // namespace strata
