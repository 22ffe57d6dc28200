// Chunk: one chunk of a job on a shard server: its FP32 p and its m, v (FP32
// or 8-bit: state_view.h; in a ChunkState: host memory, NVMe or GPU memory), two low-precision
// copies of p that workers pull (of the applied step and of the one before; always in host memory),
// and its step state machine.
//
// A chunk at applied step t accepts pushes for step t+1. Pushed gradients
// are not copied: the chunk keeps views of each push's bytes, and the push
// stays open until its step is applied. Once the pushed ranges cover the
// whole chunk it is ready: the step executor calls Apply(), which updates it
// exactly once, straight from the pushed bytes, then completes the pushes and
// answers every pull waiting for t+1. A push or pull for step t again returns
// the stored result; other steps are ABORTED. Pushes carry the workers'
// generation: a newer generation's push replaces the staged pushes of an
// older one (those workers re-formed and recompute the step), an older
// generation's push is ABORTED. The copy of step t-1 stays pullable until
// step t+1 is applied, so a new generation can recompute step t from the
// parameters every chunk had before it.
//
// Checkpoints (ArmCheckpoint ... CancelCheckpoint, chunk_save.cc): the
// chunk arms a step and waits for it; its ChunkCheckpoint
// (chunk_checkpoint.h) keeps the state of that step, which Apply() asks
// before it changes the state, and where to write the update.
// A step log (StartStepLog, chunk_step_log.cc) keeps each applied step's
// gradients and scalars for a new copy that catches up on another server.
//
// Thread-safety: all methods are thread-safe. Apply() runs on one executor
// thread at a time per chunk (Stage() returns true to exactly one caller per
// step). The state is loaded and committed under state_mu_ (Apply,
// WriteParams, ReadState); the step bookkeeping is under mu_, never held
// across I/O.
#ifndef STRATA_SHARD_CHUNK_H_
#define STRATA_SHARD_CHUNK_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/adam.h"
#include "shard/chunk_checkpoint.h"
#include "shard/chunk_groups.h"
#include "shard/chunk_state.h"
#include "shard/pushed_grads.h"
#include "shard/saved_chunk.h"
#include "shard/step_log.h"
#include "storage/metadata_store.h"
#include "storage/tier.h"
#include "strata/flat_layout.h"
#include "strata/types.h"

namespace strata {

// What each push of a step carries besides its gradients; all pushes of a
// step to a chunk must carry the same.
struct StepScalars {
  float coef = 1.0f;        // the gradients are multiplied by coef
  std::optional<float> lr;  // the step's learning rate; unset: the job's
  // The workers' loss scaler after the step, kept for checkpoints.
  std::optional<LossScaleState> loss_scale_after;
  // The step's learning rate of each parameter group, in place of lr; empty:
  // lr for all.
  std::vector<float> group_lrs;
};

// Which workers push a step, and their try of it: a newer generation's
// pushes (workers that re-formed) and a newer attempt's (the step overflowed
// and is computed again) replace the staged pushes of an older round.
struct PushRound {
  uint64_t generation = 0;
  uint32_t attempt = 0;

  bool operator==(const PushRound& o) const {
    return generation == o.generation && attempt == o.attempt;
  }
  bool operator<(const PushRound& o) const {
    return generation != o.generation ? generation < o.generation : attempt < o.attempt;
  }
};

class Chunk {
 public:
  // The most pulls one chunk keeps waiting for its next step: every worker
  // of the largest job pulls each of its chunks once or a few times a step.
  static constexpr size_t kMaxWaitingPulls = 4096;
  // Receives the low-precision parameters of the pulled range, or an error.
  // The bytes stay valid while the chunk lives and unchanged until the step
  // two after the pulled one is applied, which needs pushes from every
  // worker that pulls this chunk, each made after it received this step's
  // copy: an answer may send them where they are, keeping the chunk alive.
  // (A receiver no longer in the job -- its generation replaced -- may get
  // them changed under it; its pushes are ABORTED and it pulls again. A
  // reader outside the training copies them as it answers:
  // PullRequest.snapshot.)
  using PullDone = absl::AnyInvocable<void(absl::Status, int64_t step, absl::string_view bytes) &&>;
  // Receives the outcome of a staged push: OK once its step is applied, or
  // the error that ended it (shutdown, job dropped).
  using PushDone = absl::AnyInvocable<void(absl::Status) &&>;

  // `copy_extent` holds ChunkCopyBytes(range.size(), dtype) bytes of the host tier
  // `host` (zeros, or the copy of the state's p at `applied_step`); the chunk
  // frees it and owns `state`. A durable state's record goes to `metadata` (nullable)
  // after every change, before the change is acknowledged.
  // `groups`: how the job's parameter groups cut the chunk (default: none).
  Chunk(std::string job_id, uint32_t chunk_id, FlatRange range, DType dtype, AdamConfig adam,
        std::unique_ptr<ChunkState> state, Tier* host, Extent copy_extent,
        MetadataStore* metadata = nullptr, int64_t applied_step = 0, ChunkGroups groups = {});

  // The metadata key of a chunk's record, and the prefix of a job's.
  static std::string RecordKey(const std::string& job_id, uint32_t chunk_id);
  static std::string RecordPrefix(const std::string& job_id);
  // Writes the record of a durable state (synced); OK for other states.
  absl::Status WriteRecord() ABSL_LOCKS_EXCLUDED(state_mu_);
  // Sets the copy of the applied step from the state's p (after a restart;
  // the copy of the step before is then not available).
  absl::Status RebuildCopy() ABSL_LOCKS_EXCLUDED(state_mu_);
  // The copy of the step before the applied one (what a generation that
  // recomputes a torn step pulls), for a clean shutdown to save; empty when
  // it is not kept.
  std::string PreviousCopy() const;
  // After RebuildCopy(): sets the copy of the step before the applied one
  // from `bytes` (PreviousCopy() of the chunk before the restart).
  // INVALID_ARGUMENT when its size is not the copy's.
  absl::Status RestorePreviousCopy(absl::string_view bytes);
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  const std::string& job_id() const { return job_id_; }
  uint32_t chunk_id() const { return chunk_id_; }
  FlatRange range() const { return range_; }
  DType dtype() const { return dtype_; }
  // Where p, m, v live, and their size and precision.
  TierKind tier() const { return state_->tier(); }
  StateShape state_shape() const { return state_->shape(); }
  // Tier bytes held: the state's and the copy's.
  uint64_t num_bytes() const { return state_->num_bytes() + copy_extent_.num_bytes; }
  int64_t applied_step() const;
  // The round whose pushes made applied_step(); nullopt when its state was
  // written (WriteState, a checkpoint) rather than applied. Copies of a
  // chunk at one step applied by different rounds hold different states.
  std::optional<PushRound> applied_round() const;
  // OK, or why the chunk's state is lost: an Apply() found it corrupted
  // (DATA_LOSS from its tier). A lost chunk answers pushes, commits and
  // pulls of the next step with that error (UNAVAILABLE: workers send them
  // again until its job's copies change); only its replacement helps.
  absl::Status lost() const;
  // Parameters pushed so far for the next step.
  uint64_t staged_params() const;
  // A chunk made for a seed (AllocateChunksRequest.seeded_chunk_ids) holds
  // no state until the seed writes it, and no worker pushes to it before
  // its placement is recorded: until its state is first written, a
  // CommitStep (which reaches every chunk of the job on the server) passes
  // it by, and pushes and commits to it are ABORTED.
  void AwaitSeed();
  bool awaiting_seed() const;

  // Stages the gradients of flat range [begin, begin + n) for `step`, pushed
  // by workers in `round`, without copying: `grads` must stay valid until
  // `done` is called. `scalars` commits the step's scalars with the push
  // (unset: they follow in Commit()). Returns true when the step is now
  // ready -- the chunk's whole range staged and the step committed -- (the
  // caller then has the chunk applied), false otherwise. On OK the chunk
  // calls `done` exactly once: at once for a retry (the step is applied, or
  // the range is already staged), else when the step is applied or fails, or
  // with ABORTED when a newer round's push or commit replaces it. ABORTED for
  // old or future steps and older rounds; INVALID_ARGUMENT for a range that
  // overlaps another push of the step or scalars that differ from those
  // committed; on error `done` is not called.
  // `grads` holds n values of the job's dtype in pieces that may end at any
  // byte (as gRPC received them: rpc/step_wire.h PushMessage); an element
  // cut between two pieces is copied, nothing else. INVALID_ARGUMENT for
  // pieces of another total size.
  absl::StatusOr<bool> Stage(int64_t step, PushRound round, uint64_t begin, uint64_t n,
                             absl::Span<const absl::string_view> grads,
                             std::optional<StepScalars> scalars, PushDone done);
  // Stage() of gradients in one piece.
  absl::StatusOr<bool> Stage(int64_t step, PushRound round, uint64_t begin, uint64_t n,
                             absl::string_view grads, std::optional<StepScalars> scalars,
                             PushDone done) {
    return Stage(step, round, begin, n, absl::MakeConstSpan(&grads, 1), std::move(scalars),
                 std::move(done));
  }
  // Commits the scalars of `step` for the pushes of `round`; true when the
  // step is now ready (as Stage()). OK and false for a step already applied;
  // ABORTED for other steps and older rounds (a newer round replaces the
  // staged pushes); INVALID_ARGUMENT for scalars that differ from those
  // committed.
  absl::StatusOr<bool> Commit(int64_t step, PushRound round, const StepScalars& scalars);
  // Applies the staged step. Called once per step, after Stage() returned
  // true. If the state cannot be loaded or committed, the step is not
  // applied: the staged pushes get the error and may be pushed again.
  void Apply();
  // Answers with the copy of [begin, begin + n) at `step`: now for the
  // applied step (and the one before, while its copy is kept), once applied
  // for the next; ABORTED otherwise; RESOURCE_EXHAUSTED when
  // kMaxWaitingPulls pulls wait already. Returns the ticket of a pull that
  // waits (CancelPull() ends it), 0 for one answered at once.
  uint64_t Pull(int64_t step, uint64_t begin, uint64_t n, PullDone done);
  // Ends the waiting pull `ticket` with `status` (its caller gave up, or it
  // waited the most a pull may); nothing when it was answered already.
  void CancelPull(uint64_t ticket, const absl::Status& status);
  // Pulls waiting for the next step.
  size_t waiting_pulls() const;
  // Sets FP32 master weights of [begin, begin + n) before the first step;
  // FAILED_PRECONDITION once a step was pushed or applied; the tier's error
  // when the state cannot be loaded or committed.
  absl::Status WriteParams(uint64_t begin, const float* params, uint64_t n);
  // Sets p, m, v of [begin, begin + n) from FP32 values (8-bit moments
  // coded: state_math.h) and the applied step to `step`, before
  // any push: FAILED_PRECONDITION once a step was pushed or applied, or when
  // the chunk was written at another step; the tier's error otherwise.
  // `previous` (empty, or n values of the job's dtype): the range's copy of
  // step - 1, pullable once every range of the chunk was written with one
  // (a replica seeded from a chunk that may have to serve a torn step's
  // recompute); INVALID_ARGUMENT for another size or at step 0.
  absl::Status WriteState(uint64_t begin, const float* p, const float* m, const float* v,
                          uint64_t n, int64_t step, absl::string_view previous = {});
  // WriteState() of [begin, begin + n) from its stored form `stored`
  // (state_math.h: the same bits; StateShape{n, precision}'s bytes);
  // INVALID_ARGUMENT for a range without a stored form of its own.
  absl::Status WriteStoredState(uint64_t begin, uint64_t n, int64_t step,
                                absl::string_view previous, const std::byte* stored);
  // WriteState() of the whole chunk, its state as stored written in place by
  // `fill` (state_shape().bytes() at a 4 KiB-aligned address), without the
  // copy of the step before. `fill`'s error is returned and leaves the state
  // undefined (a restore that fails drops the job).
  absl::Status WriteStoredState(int64_t step, absl::FunctionRef<absl::Status(std::byte*)> fill);
  // A new copy's state and copies, lent to a seed that builds them in place
  // (shard/catch_up_copy.h) rather than aside and then copied in: only while
  // the chunk awaits its seed (AwaitSeed, until a WriteState), to one
  // borrower at a time, and with its state in host memory (one address
  // until it is freed). `state` holds state_shape().bytes() as
  // StateShape::ViewOf lays them out; `copies` the two copies as the chunk
  // alternates them, the copy of step t at copies + (t & 1) * range().size()
  // values of the dtype. While lent, WriteParams and WriteState are
  // FAILED_PRECONDITION and pushes ABORTED. nullopt when the chunk cannot
  // lend them.
  struct SeedBuffers {
    std::byte* state = nullptr;
    std::byte* copies = nullptr;
  };
  std::optional<SeedBuffers> LendForSeed() ABSL_LOCKS_EXCLUDED(state_mu_, mu_);
  // Ends the loan once the borrower built the state of `step` in place, the
  // copy of `step` from its p, and with `previous` the copy of step - 1:
  // the state is committed and recorded as WriteState() commits it.
  // FAILED_PRECONDITION when not lent; the tier's or the record's error
  // otherwise (the loan ends all the same).
  absl::Status CommitLentSeed(int64_t step, bool previous) ABSL_LOCKS_EXCLUDED(state_mu_, mu_);
  // Ends the loan with nothing committed: the chunk still awaits its seed.
  void EndSeedLoan() ABSL_LOCKS_EXCLUDED(mu_);
  // Settles a state and copies made to be filled (ChunkState::Settle,
  // Tier::Settle) once the state has been written whole; nothing for others.
  absl::Status SettleState() ABSL_LOCKS_EXCLUDED(state_mu_);
  // Copies p, m, v of [begin, begin + n) out in FP32 (waiting out an Apply() in
  // progress); returns the applied step they hold, or the tier's error.
  absl::StatusOr<int64_t> ReadState(uint64_t begin, uint64_t n, float* p, float* m, float* v);
  // Copies [begin, begin + n) of the state out in its stored form
  // (StateShape{n, precision}'s bytes to `out`: state_math.h); returns the
  // applied step it holds, INVALID_ARGUMENT for a range without a stored
  // form of its own, or the tier's error.
  absl::StatusOr<int64_t> CopyState(uint64_t begin, uint64_t n, std::byte* out);
  // Ends every waiting pull and every staged push with `status` (shutdown,
  // job dropped); the staged step can then be pushed again.
  void FailWaiters(const absl::Status& status);
  // From now on pushes and commits of generations before `generation` are
  // ABORTED (the job's copies are about to change: its workers re-form);
  // staged pushes of such a generation end ABORTED. Returns once no step
  // is being applied, with the applied step, which nothing but a push of
  // `generation` or later can change; DEADLINE_EXCEEDED when an apply
  // outlasts `deadline`.
  absl::StatusOr<int64_t> Fence(uint64_t generation, absl::Time deadline);

  // Keeps the state of `step` for SaveCheckpoint() to write to `path`,
  // without stopping training: a host-tier chunk's updates past `step` go to
  // a second buffer from `arena` (out of place: no copy) until the save has
  // written the buffer that holds `step`; an NVMe- or GPU-tier chunk copies
  // its state into `arena` memory. When the arena refuses the memory, the
  // Apply() past `step` writes the state to `path` itself before it updates
  // (training waits for the write instead of the server running out of
  // memory). An empty `path`: the state is only checksummed, as its file
  // would be (SaveCheckpoint() returns the checksum, nothing is written).
  // `arena` must outlive the save. ABORTED when the chunk is past `step`,
  // FAILED_PRECONDITION when armed for another step or still writing a
  // checkpoint.
  absl::Status ArmCheckpoint(int64_t step, StateArena* arena, RootedPath path)
      ABSL_LOCKS_EXCLUDED(state_mu_, mu_);
  // Waits until the chunk reaches the armed step: DEADLINE_EXCEEDED after
  // `wait_until` (disarmed), CANCELLED by CancelCheckpoint(),
  // FAILED_PRECONDITION when not armed, or the error that disarmed it (an
  // Apply() found no memory to keep the state in).
  absl::Status AwaitCheckpointStep(absl::Time wait_until) ABSL_LOCKS_EXCLUDED(mu_);
  // Once AwaitCheckpointStep() returned OK: writes the chunk's state at the
  // armed step to the armed path (synced, server/saved_chunk.h; straight
  // from the buffer that holds it), unless an Apply() wrote it already, and
  // disarms. Returns the file's checksum and sets `loss_scale` to the loss
  // scaler the step's pushes reported; AwaitCheckpointStep()'s error when
  // the step is not reached (or the checkpoint was cancelled), or the I/O
  // error naming the file.
  absl::StatusOr<uint64_t> SaveCheckpoint(std::optional<LossScaleState>* loss_scale)
      ABSL_LOCKS_EXCLUDED(state_mu_, mu_);
  // Disarms, ending an AwaitCheckpointStep() that waits.
  void CancelCheckpoint() ABSL_LOCKS_EXCLUDED(state_mu_, mu_);

  // Starts a log of the steps this chunk applies from now on (ending the
  // one it kept): every step after its since_step() (waiting out an Apply()
  // in progress) is appended as it is applied.
  std::shared_ptr<StepLog> StartStepLog() ABSL_LOCKS_EXCLUDED(state_mu_, mu_);
  // The log StartStepLog() began (ended or not); FAILED_PRECONDITION when
  // none was started, or it was ended by EndStepLog().
  absl::StatusOr<std::shared_ptr<StepLog>> step_log() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends and forgets the step log, if any.
  void EndStepLog() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct StagedPush {
    uint64_t end;
    PushedGrads grads;
    PushDone done;
  };
  struct Waiter {
    uint64_t ticket;
    int64_t step;
    uint64_t begin;
    uint64_t n;
    PullDone done;
  };
  // The copy of `step`: the two copies alternate.
  std::byte* copy(int64_t step) const {
    return copies_ + (step & 1) * range_.size() * DTypeSize(dtype_);
  }
  absl::string_view CopyView(int64_t step, uint64_t begin, uint64_t n) const;
  absl::Status WriteRecordLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Commits `view` (state_->Load()'s) with the record of `step`, rolling the
  // commit back when the record cannot be written, and releases the view.
  absl::Status CommitAndRelease(const StateView& view, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Changes [offset, offset + n) of the loaded state `view`.
  using StateWrite = absl::FunctionRef<absl::Status(const StateView& view, uint64_t offset)>;
  // Loads the state, has `write` change [begin, begin + n), sets the copy
  // of `step` there from the new p, and commits the state with the record of
  // `step`. The tier's error leaves the state as it was; `write`'s error is
  // returned, nothing committed.
  absl::Status WriteAndCommit(uint64_t begin, uint64_t n, int64_t step, StateWrite write)
      ABSL_LOCKS_EXCLUDED(state_mu_);
  // INVALID_ARGUMENT, naming the range, when [begin, begin + n) has no
  // stored form of its own (state_math.h IsStoredRange).
  absl::Status CheckStoredRange(uint64_t begin, uint64_t n) const;
  // FAILED_PRECONDITION while the state is lent to a seed (LendForSeed).
  absl::Status NotLentLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // WriteState()'s checks and step bookkeeping, then WriteAndCommit().
  absl::Status SetState(uint64_t begin, uint64_t n, int64_t step, absl::string_view previous,
                        StateWrite write) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Apply()'s update of the state to `step`, writing the copy of `step` to
  // `copy_out`: loaded into memory and committed, or in the state's tier.
  // The tier's error leaves the state as it was.
  // The chunk's ranges of `pushes`' gradients.
  std::vector<GradRange> GradRanges(const std::map<uint64_t, StagedPush>& pushes) const;
  absl::Status UpdateInMemory(int64_t step, const std::vector<ConstantsSpan>& spans,
                              const std::map<uint64_t, StagedPush>& pushes, std::byte* copy_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  absl::Status UpdateInTier(int64_t step, const std::vector<ConstantsSpan>& spans,
                            const std::map<uint64_t, StagedPush>& pushes, std::byte* copy_out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Whether a checkpoint of `step` is armed and its state not yet kept.
  bool CheckpointNeedsState(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // In Apply(), before the state of `step` changes, once
  // CheckpointNeedsState(step): notes the step's loss scaler and has the
  // ChunkCheckpoint keep `live`; a write's error disarms the checkpoint
  // (training does not fail for a checkpoint).
  void KeepCheckpointState(int64_t step, const StateView& live)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Where Apply() writes the update of the live state (ChunkCheckpoint::
  // UpdateTarget); a write it made that failed disarms the checkpoint.
  StateView UpdateTarget(const StateView& loaded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Disarms the checkpoint with `failure` (OK: cancelled) and lets go of
  // what it kept, except a buffer being written.
  void DisarmLocked(const absl::Status& failure) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  // Checks that a push or commit of `step` in `round` may change the staged
  // step: false for a retry of an applied step; ABORTED for other steps and
  // older rounds. A newer round's moves the staged pushes to `superseded`.
  absl::StatusOr<bool> EnterRound(int64_t step, PushRound round,
                                  std::map<uint64_t, StagedPush>* superseded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `scalars` for the staged step: INVALID_ARGUMENT when others are.
  absl::Status CommitLocked(int64_t step, const StepScalars& scalars)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the staged step is ready to apply; marks it applying if so.
  bool TakeReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pushes a newer round replaced with ABORTED.
  void EndSuperseded(std::map<uint64_t, StagedPush> superseded, int64_t step, PushRound by);
  // In Apply(), once `step` is applied: the step as the log keeps it (its
  // gradients gathered from `pushes`).
  std::shared_ptr<const LoggedStep> LogEntry(int64_t step, const StepScalars& scalars,
                                             const std::map<uint64_t, StagedPush>& pushes) const;
  // Ends a failed Apply(): the step stays unapplied and `pushes` get `status`.
  void FailApply(std::map<uint64_t, StagedPush> pushes, const absl::Status& status);

  const std::string job_id_;
  const uint32_t chunk_id_;
  const FlatRange range_;
  const DType dtype_;
  const AdamConfig adam_;
  const ChunkGroups groups_;
  Tier* const host_;
  const Extent copy_extent_;
  std::byte* const copies_;
  MetadataStore* const metadata_;

  absl::Mutex state_mu_;
  const std::unique_ptr<ChunkState> state_ ABSL_PT_GUARDED_BY(state_mu_);
  // The buffers of the armed checkpoint's state.
  ChunkCheckpoint checkpoint_ ABSL_GUARDED_BY(state_mu_);

  mutable absl::Mutex mu_;
  int64_t applied_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<PushRound> applied_round_ ABSL_GUARDED_BY(mu_);
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  bool applied_any_ ABSL_GUARDED_BY(mu_) = false;  // Apply() succeeded once
  bool awaiting_seed_ ABSL_GUARDED_BY(mu_) = false;
  bool lent_for_seed_ ABSL_GUARDED_BY(mu_) = false;  // LendForSeed() until its loan ends
  // Set by an Apply() that found the state corrupted (lost()).
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  // The oldest generation whose pushes and commits the chunk takes (Fence).
  uint64_t min_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Params of the chunk whose copy of the step before WriteState()'s was written.
  uint64_t previous_written_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether copy(applied_step_ - 1) holds that step's parameters.
  bool previous_copy_valid_ ABSL_GUARDED_BY(mu_) = false;
  // Pushes staged for step applied_step_ + 1 in staged_round_, by begin, and
  // the step's scalars once committed in that round.
  std::map<uint64_t, StagedPush> staged_ ABSL_GUARDED_BY(mu_);
  PushRound staged_round_ ABSL_GUARDED_BY(mu_);
  uint64_t staged_params_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<StepScalars> committed_ ABSL_GUARDED_BY(mu_);
  // The loss scaler after each of the last two applied steps (by step & 1).
  std::optional<LossScaleState> loss_scales_[2] ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t last_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // The armed checkpoint's step, or -1, the error that disarmed it, if
  // any, and the loss scaler of the step, once kept.
  int64_t checkpoint_step_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status checkpoint_failure_ ABSL_GUARDED_BY(mu_);
  std::optional<LossScaleState> checkpoint_loss_scale_ ABSL_GUARDED_BY(mu_);
  // The step log, if one was started; started under state_mu_ too, so that
  // no Apply() (which holds state_mu_) runs between a log's start and its
  // first step.
  std::shared_ptr<StepLog> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_H_
