#include "shard/state_arena.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/memory_pages.h"

namespace strata {

std::byte* AllocateFaultedIn(size_t bytes) {
  void* memory = std::aligned_alloc(StateArena::kAlignment, bytes);
  if (memory == nullptr) return nullptr;
  AdviseHugePages(memory, bytes);
  FaultInPages(memory, bytes);
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
    if (std::optional<uint64_t> offset = free_.TakeBestFit(rounded)) {
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
    while (!FitsLimit(rounded) && !kept_.empty()) {
      DropBeyond(kept_.begin()->first);
      freed.push_back(kept_.begin()->second);
      kept_.erase(kept_.begin());
    }
    if (!FitsLimit(rounded)) {
      refused_bytes_ += rounded;
      return absl::ResourceExhaustedError(absl::StrCat(
          "the checkpoint memory limit (", limit_bytes_ >> 20, " MiB, ", taken_bytes_ >> 20,
          " MiB out) has no room for a chunk state of ", rounded >> 20, " MiB"));
    }
    // Counted here, so that takes racing for the last bytes do not all pass.
    CountBeyond(rounded);
    CountTaken(rounded);
  }
  for (std::byte* piece : freed) std::free(piece);
  // Outside the lock: faulting memory in takes milliseconds.
  std::byte* piece = AllocateFaultedIn(rounded);
  absl::MutexLock lock(&mu_);
  if (piece == nullptr) {
    DropBeyond(rounded);
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

uint64_t StateArena::CountOf(const std::map<uint64_t, uint64_t>& pieces, uint64_t rounded) {
  const auto it = pieces.find(rounded);
  return it == pieces.end() ? 0 : it->second;
}

bool StateArena::FitsLimit(uint64_t rounded) const {
  return retained_bytes() + beyond_bytes_ + rounded <= limit_bytes_;
}

void StateArena::CountBeyond(uint64_t rounded) {
  beyond_bytes_ += rounded;
  ++beyond_pieces_[rounded];
}

void StateArena::DropBeyond(uint64_t rounded) {
  beyond_bytes_ -= rounded;
  if (--beyond_pieces_[rounded] == 0) beyond_pieces_.erase(rounded);
}

void StateArena::Give(std::byte* piece, uint64_t bytes) {
  const uint64_t rounded = PieceBytes(bytes);
  const bool in_region =
      region_ != nullptr && piece >= region_ && piece < region_ + retained_bytes_;
  {
    absl::MutexLock lock(&mu_);
    taken_bytes_ -= rounded;
    if (in_region) {
      free_.Give(piece - region_, rounded);
      region_taken_bytes_ -= rounded;
      return;
    }
    if (CountOf(beyond_pieces_, rounded) <= CountOf(NeededBeyond(), rounded)) {
      kept_.emplace(rounded, piece);
      return;
    }
    DropBeyond(rounded);
  }
  std::free(piece);
}

std::map<uint64_t, uint64_t> StateArena::NeededBeyond() const {
  std::map<uint64_t, uint64_t> needed;
  uint64_t region_left = retained_bytes();
  for (const auto& [rounded, count] : reserved_pieces_) {
    const uint64_t in_region = std::min(count, region_left / rounded);
    region_left -= in_region * rounded;
    if (count > in_region) needed[rounded] = count - in_region;
  }
  return needed;
}

void StateArena::Reserve(const std::vector<uint64_t>& piece_bytes) {
  absl::MutexLock lock(&mu_);
  for (uint64_t bytes : piece_bytes) {
    const uint64_t rounded = PieceBytes(bytes);
    ++reserved_pieces_[rounded];
    reserved_bytes_ += rounded;
  }
}

void StateArena::Unreserve(const std::vector<uint64_t>& piece_bytes) {
  std::vector<std::byte*> freed;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t bytes : piece_bytes) {
      auto it = reserved_pieces_.find(PieceBytes(bytes));
      if (it == reserved_pieces_.end()) continue;
      reserved_bytes_ -= it->first;
      if (--it->second == 0) reserved_pieces_.erase(it);
    }
    const std::map<uint64_t, uint64_t> needed = NeededBeyond();
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (CountOf(beyond_pieces_, it->first) <= CountOf(needed, it->first)) {
        ++it;
        continue;
      }
      DropBeyond(it->first);
      freed.push_back(it->second);
      it = kept_.erase(it);
    }
  }
  for (std::byte* piece : freed) std::free(piece);
}

StateArena::FaultedIn StateArena::FaultInReserved() {
  std::vector<uint64_t> missing;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [rounded, count] : NeededBeyond()) {
      for (uint64_t held = CountOf(beyond_pieces_, rounded); held < count && FitsLimit(rounded);
           ++held) {
        // Counted now, as in Take(), so that a concurrent call does not allocate it too.
        CountBeyond(rounded);
        missing.push_back(rounded);
      }
    }
  }
  FaultedIn result;
  for (uint64_t rounded : missing) {
    std::byte* piece = AllocateFaultedIn(rounded);
    absl::MutexLock lock(&mu_);
    if (piece == nullptr) {
      DropBeyond(rounded);
      continue;
    }
    kept_.emplace(rounded, piece);
    allocated_beyond_bytes_ += rounded;
    result.allocated_bytes += rounded;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [rounded, count] : NeededBeyond()) {
    const uint64_t held = CountOf(beyond_pieces_, rounded);
    if (held < count) result.short_bytes += (count - held) * rounded;
  }
  return result;
}

uint64_t StateArena::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_bytes_;
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
