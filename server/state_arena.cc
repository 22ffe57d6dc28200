#include "server/state_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata {

std::byte* AllocateFaultedIn(size_t bytes) {
  void* memory = std::aligned_alloc(StateArena::kAlignment, bytes);
  if (memory == nullptr) return nullptr;
  // MADV_POPULATE_WRITE is Linux 5.14's; older kernels refuse it, and then
  // each page is touched.
  if (madvise(memory, bytes, MADV_POPULATE_WRITE) != 0) {
    for (size_t i = 0; i < bytes; i += StateArena::kAlignment) {
      static_cast<volatile char*>(memory)[i] = 0;
    }
  }
  return static_cast<std::byte*>(memory);
}

StateArena::StateArena(uint64_t retained_bytes, uint64_t limit_bytes)
    : retained_bytes_(retained_bytes / kAlignment * kAlignment),
      limit_bytes_(std::max(limit_bytes, retained_bytes_)),
      region_(retained_bytes_ > 0 ? AllocateFaultedIn(retained_bytes_) : nullptr) {
  if (region_ != nullptr) free_.Give(0, retained_bytes_);
}

StateArena::~StateArena() {
  for (const auto& [bytes, piece] : kept_) std::free(piece);
  std::free(region_);
}

absl::StatusOr<std::byte*> StateArena::Take(uint64_t bytes) {
  const uint64_t rounded = PieceBytes(bytes);
  std::vector<std::byte*> freed;  // kept pieces that make room, freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    if (std::optional<uint64_t> offset = free_.TakeFirstFit(rounded)) {
      region_taken_bytes_ += rounded;
      CountTaken(rounded);
      return region_ + *offset;
    }
    if (auto it = kept_.find(rounded); it != kept_.end()) {
      std::byte* piece = it->second;
      kept_.erase(it);
      CountTaken(rounded);
      return piece;
    }
    while (retained_bytes() + beyond_bytes_ + rounded > limit_bytes_ && !kept_.empty()) {
      beyond_bytes_ -= kept_.begin()->first;
      freed.push_back(kept_.begin()->second);
      kept_.erase(kept_.begin());
    }
    if (retained_bytes() + beyond_bytes_ + rounded > limit_bytes_) {
      refused_bytes_ += rounded;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the checkpoint memory limit (", limit_bytes_ >> 20, " MiB, ", taken_bytes_ >> 20,
          " MiB out) has no room for a chunk state of ", rounded >> 20, " MiB"));
    }
    // Reserved here, so that takes racing for the last bytes do not all pass.
    beyond_bytes_ += rounded;
    CountTaken(rounded);
  }
  for (std::byte* piece : freed) std::free(piece);
  // Outside the lock: faulting memory in takes milliseconds.
  std::byte* piece = AllocateFaultedIn(rounded);
  absl::MutexLock lock(&mu_);
  if (piece == nullptr) {
    beyond_bytes_ -= rounded;
    taken_bytes_ -= rounded;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the system refused ", rounded, " bytes of host memory for a chunk state kept aside"));
  }
  allocated_beyond_bytes_ += rounded;
  return piece;
}

void StateArena::CountTaken(uint64_t bytes) {
  taken_bytes_ += bytes;
  peak_taken_bytes_ = std::max(peak_taken_bytes_, taken_bytes_);
}

void StateArena::Give(std::byte* piece, uint64_t bytes) {
  const uint64_t rounded = PieceBytes(bytes);
  const bool in_region =
      region_ != nullptr && piece >= region_ && piece < region_ + retained_bytes_;
  absl::MutexLock lock(&mu_);
  taken_bytes_ -= rounded;
  if (in_region) {
    free_.Give(piece - region_, rounded);
    region_taken_bytes_ -= rounded;
  } else {
    kept_.emplace(rounded, piece);
  }
}

uint64_t StateArena::Prepare(const std::vector<uint64_t>& piece_bytes) {
  std::vector<uint64_t> missing;
  {
    absl::MutexLock lock(&mu_);
    uint64_t region_free = retained_bytes() - region_taken_bytes_;
    std::map<uint64_t, size_t> kept_by_size;
    for (const auto& [bytes, piece] : kept_) ++kept_by_size[bytes];
    for (uint64_t bytes : piece_bytes) {
      const uint64_t rounded = PieceBytes(bytes);
      if (region_free >= rounded) {
        region_free -= rounded;
      } else if (size_t& kept = kept_by_size[rounded]; kept > 0) {
        --kept;
      } else if (retained_bytes() + beyond_bytes_ + rounded <= limit_bytes_) {
        beyond_bytes_ += rounded;  // reserved, as in Take()
        missing.push_back(rounded);
      }
    }
  }
  uint64_t allocated = 0;
  for (uint64_t rounded : missing) {
    std::byte* piece = AllocateFaultedIn(rounded);
    absl::MutexLock lock(&mu_);
    if (piece == nullptr) {
      beyond_bytes_ -= rounded;
      continue;
    }
    kept_.emplace(rounded, piece);
    allocated_beyond_bytes_ += rounded;
    allocated += rounded;
  }
  return allocated;
}

uint64_t StateArena::taken_bytes() const {
  absl::MutexLock lock(&mu_);
  return taken_bytes_;
}

uint64_t StateArena::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return retained_bytes() + beyond_bytes_;
}

uint64_t StateArena::peak_taken_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_taken_bytes_;
}

uint64_t StateArena::refused_bytes() const {
  absl::MutexLock lock(&mu_);
  return refused_bytes_;
}

uint64_t StateArena::allocated_beyond_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_beyond_bytes_;
}

}  // namespace strata
