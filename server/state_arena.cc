#include "server/state_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

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

StateArena::~StateArena() { std::free(region_); }

absl::StatusOr<std::byte*> StateArena::Take(uint64_t bytes) {
  const uint64_t rounded = std::max(RoundUp(bytes), kAlignment);
  {
    absl::MutexLock lock(&mu_);
    if (std::optional<uint64_t> offset = free_.TakeFirstFit(rounded)) {
      CountTaken(rounded);
      return region_ + *offset;
    }
    // Reserved here, so that takes racing for the last bytes do not all pass.
    if (taken_bytes_ + rounded > limit_bytes_) {
      refused_bytes_ += rounded;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the checkpoint memory limit (", limit_bytes_ >> 20, " MiB, ", taken_bytes_ >> 20,
          " MiB out) has no room for a chunk state of ", rounded >> 20, " MiB"));
    }
    CountTaken(rounded);
  }
  // Outside the lock: faulting memory in takes milliseconds.
  std::byte* piece = AllocateFaultedIn(rounded);
  absl::MutexLock lock(&mu_);
  if (piece == nullptr) {
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
  const uint64_t rounded = std::max(RoundUp(bytes), kAlignment);
  const bool in_region =
      region_ != nullptr && piece >= region_ && piece < region_ + retained_bytes_;
  if (!in_region) std::free(piece);
  absl::MutexLock lock(&mu_);
  taken_bytes_ -= rounded;
  if (in_region) free_.Give(piece - region_, rounded);
}

uint64_t StateArena::taken_bytes() const {
  absl::MutexLock lock(&mu_);
  return taken_bytes_;
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
