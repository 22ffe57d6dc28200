#include "shard/chunk_checkpoint.h"

#include <utility>

#include "core/status_macros.h"

namespace strata {

void ChunkCheckpoint::Arm(StateArena* arena, RootedPath path) {
  arena_ = arena;
  path_ = std::move(path);
  written_.reset();
}

StateView ChunkCheckpoint::LiveView(const StateView& loaded) const {
  return live_in_shadow_ ? shadow_.view() : loaded;
}

absl::Status ChunkCheckpoint::Keep(const StateView& live) {
  if (tier_ == TierKind::kHost) {
    held_ = LiveBuffer();
    return absl::OkStatus();
  }
  absl::StatusOr<ArenaState> copy = CopyToArena(live);
  if (!copy.ok()) return WriteNow(live);
  copy_ = *std::move(copy);
  return absl::OkStatus();
}

absl::StatusOr<ArenaState> ChunkCheckpoint::CopyToArena(const StateView& view) const {
  ASSIGN_OR_RETURN(ArenaState copy, ArenaState::Take(arena_, shape_));
  copy.CopyFrom(view);
  return copy;
}

absl::Status ChunkCheckpoint::WriteNow(const StateView& live) {
  absl::StatusOr<uint64_t> checksum = SaveOrChecksumChunkState(path_, live.bytes(), shape_.bytes());
  held_ = Buffer::kNone;
  RETURN_IF_ERROR(checksum.status());
  written_ = *checksum;
  return absl::OkStatus();
}

StateView ChunkCheckpoint::UpdateTarget(const StateView& loaded, absl::Mutex& state_mu,
                                        absl::Status* failure) {
  const Buffer live = LiveBuffer();
  if (held_ == live) {
    if (live == Buffer::kShadow) return loaded;
    if (shadow_.empty()) {
      absl::StatusOr<ArenaState> shadow = ArenaState::Take(arena_, shape_);
      if (!shadow.ok()) {
        state_mu.Await(absl::Condition(
            +[](bool* writing) { return !*writing; }, &writing_held_));
        if (held_ == live) *failure = WriteNow(loaded);
        return loaded;
      }
      shadow_ = *std::move(shadow);
    }
    return shadow_.view();
  }
  // The live state in the shadow and the extent free: back to the extent.
  if (live == Buffer::kShadow && held_ != Buffer::kExtent) return loaded;
  return LiveView(loaded);
}

void ChunkCheckpoint::Updated(const StateView& out) {
  live_in_shadow_ = !shadow_.empty() && out.bytes() == shadow_.data();
  ReleaseUnusedShadow();
}

void ChunkCheckpoint::ReleaseUnusedShadow() {
  if (!live_in_shadow_ && held_ != Buffer::kShadow) shadow_.Reset();
}

void ChunkCheckpoint::Disarm() {
  if (!writing_held_) {
    held_ = Buffer::kNone;
    ReleaseUnusedShadow();
  }
  copy_.Reset();
  written_.reset();
}

std::optional<uint64_t> ChunkCheckpoint::TakeWritten() {
  return std::exchange(written_, std::nullopt);
}

absl::StatusOr<const std::byte*> ChunkCheckpoint::BeginSave(const StateView& loaded,
                                                            ArenaState* copy) {
  if (tier_ == TierKind::kHost) {
    if (held_ == Buffer::kNone) held_ = LiveBuffer();
    writing_held_ = true;
    return held_ == Buffer::kShadow ? shadow_.data() : loaded.bytes();
  }
  if (!copy_.empty()) {
    *copy = std::move(copy_);
    return copy->data();
  }
  absl::StatusOr<ArenaState> made = CopyToArena(loaded);
  if (!made.ok()) {
    RETURN_IF_ERROR(WriteNow(loaded));
    return nullptr;
  }
  *copy = *std::move(made);
  return copy->data();
}

void ChunkCheckpoint::EndSave() {
  writing_held_ = false;
  held_ = Buffer::kNone;
  ReleaseUnusedShadow();
}

}  // namespace strata
