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

StateArena::StateArena(uint64_t retained_bytes)
    : retained_bytes_(retained_bytes / kAlignment * kAlignment),
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
  }
  // Outside the lock: faulting memory in takes milliseconds.
  std::byte* piece = AllocateFaultedIn(rounded);
  if (piece == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the system refused ", rounded, " bytes of host memory for a chunk state kept aside"));
  }
  absl::MutexLock lock(&mu_);
  CountTaken(rounded);
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

uint64_t StateArena::allocated_beyond_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_beyond_bytes_;
}

}  // namespace strata
