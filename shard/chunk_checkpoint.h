// ChunkCheckpoint: where a chunk keeps the state of the step a checkpoint
// is armed for while training goes on, until the save writes it. A
// host-tier chunk holds the buffer with that state (its tier extent, or a
// second buffer from the arena, the shadow) and the updates after it go
// to the other buffer: out of place, no copy. An NVMe- or GPU-tier chunk
// copies its state into the arena. When the arena refuses the memory, the
// state is written to the checkpoint's file at once (training waits for
// the write rather than the server running out of memory).
//
// Chunk::Apply() asks it twice: before the update, to keep the armed step's
// state (Keep), and for where the update goes (UpdateTarget, then Updated).
// The Chunk keeps the armed step, the wait for it and the errors that
// disarm it; this class only the buffers.
//
// Thread-compatible: the chunk's state mutex guards it (UpdateTarget waits
// on it for a save's write to end).
#ifndef STRATA_SHARD_CHUNK_CHECKPOINT_H_
#define STRATA_SHARD_CHUNK_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/path_root.h"
#include "shard/saved_chunk.h"
#include "shard/state_arena.h"
#include "shard/state_view.h"
#include "storage/tier.h"

namespace strata {

class ChunkCheckpoint {
 public:
  // For a chunk whose state is in `tier`, shaped `shape`.
  ChunkCheckpoint(TierKind tier, StateShape shape) : tier_(tier), shape_(shape) {}
  ChunkCheckpoint(const ChunkCheckpoint&) = delete;
  ChunkCheckpoint& operator=(const ChunkCheckpoint&) = delete;

  // Arms a save to `path` (empty: only checksummed) with buffers from
  // `arena`, which must outlive it. Not while writing().
  void Arm(StateArena* arena, RootedPath path);
  // Whether a save is writing a held buffer now.
  bool writing() const { return writing_held_; }
  // Whether a buffer is held for a save: the state must not be written
  // outside a step until the save ends.
  bool holds_buffer() const { return held_ != Buffer::kNone; }
  // Whether the armed step's state is kept: held, copied or written.
  bool kept() const { return held_ != Buffer::kNone || !copy_.empty() || written_.has_value(); }
  // The live state: `loaded` (the tier's view) or the shadow.
  StateView LiveView(const StateView& loaded) const;

  // Apply()'s first hook, before the armed step's state `live` changes:
  // keeps it (holds its buffer, copies it, or writes it now). The write's
  // error, which disarms the checkpoint.
  absl::Status Keep(const StateView& live);
  // Apply()'s second hook: where the update of the live state goes for a
  // host-tier chunk whose tier view is `loaded`: in place, unless the live
  // buffer is held (then the other one, the shadow taken from the arena),
  // or back to the extent once the shadow is live and the extent free. If
  // the arena refuses the shadow, waits (on `state_mu`, held) for a save's
  // write of the held buffer to end, or else writes it now, and the update
  // goes in place; that write's error goes to `failure` (it disarms).
  StateView UpdateTarget(const StateView& loaded, absl::Mutex& state_mu, absl::Status* failure);
  // After the update to `out` (UpdateTarget()'s) is committed.
  void Updated(const StateView& out);
  // Lets go of what was kept, except a buffer being written.
  void Disarm();

  // The save's side. The checksum of the file a Keep() or UpdateTarget()
  // wrote, if one did (the checkpoint then has nothing left to write).
  std::optional<uint64_t> TakeWritten();
  const RootedPath& path() const { return path_; }
  // The armed step's state for the save to write, the chunk at that step
  // or past it, its tier view `loaded`: a host-tier chunk's held buffer
  // (or live one, held now), marked as being written until EndSave(); an
  // NVMe- or GPU-tier chunk's copy, moved to `copy`, or one made now.
  // nullptr when the arena refuses that copy: `loaded` is written at once
  // (TakeWritten() has its checksum; no EndSave()); that write's error.
  absl::StatusOr<const std::byte*> BeginSave(const StateView& loaded, ArenaState* copy);
  // After BeginSave()'s state was written.
  void EndSave();

 private:
  // Which buffer holds a host-tier chunk's p, m, v.
  enum class Buffer { kNone, kExtent, kShadow };
  Buffer LiveBuffer() const { return live_in_shadow_ ? Buffer::kShadow : Buffer::kExtent; }
  // `view` copied into arena memory; RESOURCE_EXHAUSTED when the arena
  // refuses it.
  absl::StatusOr<ArenaState> CopyToArena(const StateView& view) const;
  // Writes `live` to the armed path now and lets go of the held buffer.
  absl::Status WriteNow(const StateView& live);
  // Gives the shadow back when it holds neither the live state nor a held one.
  void ReleaseUnusedShadow();

  const TierKind tier_;
  const StateShape shape_;
  StateArena* arena_ = nullptr;
  RootedPath path_;
  // The checksum of the file, once a hook wrote it.
  std::optional<uint64_t> written_;
  // A host-tier chunk's second buffer (empty unless a checkpoint needs it),
  // whether it holds the live state, the buffer held with the armed step's
  // state (no update writes it until the save wrote it), and whether a
  // save is writing it now.
  ArenaState shadow_;
  bool live_in_shadow_ = false;
  Buffer held_ = Buffer::kNone;
  bool writing_held_ = false;
  // An NVMe- or GPU-tier chunk's copy of the armed step's state.
  ArenaState copy_;
};

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_CHECKPOINT_H_
