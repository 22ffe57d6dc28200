#include "shard/nvme_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata {

NvmeSlots::NvmeSlots(Tier* nvme, int spares) : nvme_(nvme), spares_(std::max(spares, 1)) {}

void NvmeSlots::Trim(uint64_t slot_bytes) {
  auto it = sizes_.find(slot_bytes);
  if (it == sizes_.end()) return;
  Size& size = it->second;
  while (size.spares() > SparesWanted(size) && !size.free_spares.empty()) {
    nvme_->Free(size.free_spares.back());
    size.free_spares.pop_back();
  }
  if (size.states == 0 && size.spares() == 0) sizes_.erase(it);
}

absl::Status NvmeSlots::MakeMissingSpares() {
  for (auto& [slot_bytes, size] : sizes_) {
    while (size.spares() < SparesWanted(size)) {
      absl::StatusOr<Extent> spare = nvme_->Allocate(slot_bytes);
      if (!spare.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("NVMe tier: no room for the spare slots of the states of ", slot_bytes,
                         " bytes it holds (", nvme_->used_bytes(), " of ", nvme_->budget_bytes(),
                         " bytes in use)"));
      }
      size.free_spares.push_back(*spare);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Extent> NvmeSlots::Allocate(uint64_t slot_bytes) {
  absl::MutexLock lock(&mu_);
  // States adopted after a restart have their spares before any new state.
  if (absl::Status made = MakeMissingSpares(); !made.ok()) return made;
  Size& size = sizes_[slot_bytes];
  absl::StatusOr<Extent> slot = nvme_->Allocate(slot_bytes);
  absl::StatusOr<Extent> spare = Extent{};
  const bool spare_wanted = size.spares() < std::min(spares_, size.states + 1);
  if (slot.ok() && spare_wanted) spare = nvme_->Allocate(slot_bytes);
  if (!slot.ok() || !spare.ok()) {
    if (slot.ok()) nvme_->Free(*slot);
    absl::Status refused = absl::ResourceExhaustedError(absl::StrCat(
        "NVMe tier: no room for a state's slot of ", slot_bytes, " bytes",
        spare_wanted ? " and the spare its commits write" : "", " (", nvme_->used_bytes(), " of ",
        nvme_->budget_bytes(), " bytes in use, ", size.spares(), " spares of that size kept)"));
    Trim(slot_bytes);  // may forget `size`
    return refused;
  }
  ++size.states;
  if (spare_wanted) size.free_spares.push_back(*spare);
  return slot;
}

void NvmeSlots::Adopted(const Extent& slot) {
  absl::MutexLock lock(&mu_);
  ++sizes_[slot.num_bytes].states;
}

void NvmeSlots::Free(const Extent& slot) {
  absl::MutexLock lock(&mu_);
  nvme_->Free(slot);
  if (auto it = sizes_.find(slot.num_bytes); it != sizes_.end() && it->second.states > 0) {
    --it->second.states;
  }
  Trim(slot.num_bytes);
}

absl::StatusOr<Extent> NvmeSlots::BeginCommit(uint64_t slot_bytes) {
  absl::MutexLock lock(&mu_);
  Size& size = sizes_[slot_bytes];  // a map's elements stay where they are
  while (size.free_spares.empty()) {
    if (size.spares() < std::max(SparesWanted(size), 1)) {
      // Adopted states' spares are made as they commit first.
      absl::StatusOr<Extent> spare = nvme_->Allocate(slot_bytes);
      if (spare.ok()) {
        size.free_spares.push_back(*spare);
        break;
      }
      if (size.committing == 0) {
        Trim(slot_bytes);
        return absl::ResourceExhaustedError(
            absl::StrCat("NVMe tier: no room for the spare slot of ", slot_bytes,
                         " bytes that a commit writes: ", spare.status().message()));
      }
    }
    mu_.Await(absl::Condition(
        +[](Size* size) { return !size->free_spares.empty() || size->committing == 0; }, &size));
  }
  const Extent next = size.free_spares.back();
  size.free_spares.pop_back();
  ++size.committing;
  return next;
}

void NvmeSlots::EndCommit(const Extent& unused) {
  absl::MutexLock lock(&mu_);
  Size& size = sizes_[unused.num_bytes];
  --size.committing;
  size.free_spares.push_back(unused);
  Trim(unused.num_bytes);
}

}  // namespace strata
