// ShardService: the gRPC ShardServer service (proto/strata/v1/shard.proto).
// Reactors parse, validate and stage; the optimizer runs on the step
// executor, one task per chunk and step. A push is answered once its step is
// applied (the chunk reads the gradients from the request itself). Every request is validated
// before it touches state: bad input gets a status naming the problem and changes nothing.
// Thread-safe; BeginShutdown() refuses new work and answers every waiting pull with UNAVAILABLE.
// The implementation is one file per concern: the step and job RPCs
// (shard_service.cc), chunk placement over the tiers (chunk_placement.cc),
// recovery of a previous run's jobs (recovery.cc), the checkpoint RPCs
// (checkpoint_rpcs.cc), seeding copies from another server (seed_rpcs.cc)
// and the metrics (shard_metrics.cc); the jobs are a JobTable (job_table.h).
#ifndef STRATA_SHARD_SHARD_SERVICE_H_
#define STRATA_SHARD_SHARD_SERVICE_H_

#include <grpcpp/channel.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "core/path_root.h"
#include "core/thread_pool.h"
#include "rpc/authenticator.h"
#include "rpc/metrics.h"
#include "rpc/shard_server_service.h"
#include "shard/answers_in_flight.h"
#include "shard/catch_up_copy.h"
#include "shard/catch_up_seeder.h"
#include "shard/chunk.h"
#include "shard/job_table.h"
#include "shard/nvme_slots.h"
#include "shard/state_arena.h"
#include "storage/metadata_store.h"
#include "storage/nvme_tier.h"
#include "storage/tier.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class ShardService final : public ShardServerService, public WorkerTokens {
 public:
  // The longest a SaveChunks may wait for its step (its wait_ms): an hour,
  // far above the coordinator's waits.
  static constexpr int64_t kMaxSaveWaitMs = 60 * 60 * 1000;
  // The longest AllocateChunks waits for a step being applied to end.
  static constexpr absl::Duration kMaxFenceWait = absl::Seconds(30);
  // Chunk states go to `gpu` first (nullptr: none), then `host`, then `nvme`
  // (nullptr: none). Chunks are applied on `executor`, those whose state is on NVMe on
  // `nvme_executor` (required with `nvme`): they wait for the disk, and the
  // host-tier chunks of every job must not wait behind them. Checkpoints
  // keep chunk states aside in `checkpoint_arena`. Jobs a
  // previous run recorded in `metadata` come back when every chunk was on NVMe
  // or saved by SaveMemoryChunks() into `saved_chunks_dir` (at the steps
  // recorded); the others are discarded, with a log line saying why.
  // SaveChunks and LoadChunks take directories inside `checkpoint_root`
  // only (nullopt: they are refused).
  static absl::StatusOr<std::unique_ptr<ShardService>> Create(
      Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata, ThreadPool* executor,
      ThreadPool* nvme_executor, StateArena* checkpoint_arena, std::string saved_chunks_dir,
      std::optional<PathRoot> checkpoint_root);

  void BeginShutdown();
  // Once the gRPC server is gone: waits until gRPC has let go of every pull
  // answer that references a chunk's memory (AnswersInFlight), or until
  // `deadline`; whether none is left, so that the tiers may be freed.
  bool AwaitAnswersReleased(absl::Time deadline) { return answers_->AwaitNone(deadline); }
  // At a clean shutdown, once no step is being applied: saves every chunk
  // state in host or GPU memory to a file (synced) and records it, so that
  // the next start-up finds it. Chunks that fail to save are logged and lost.
  void SaveMemoryChunks();
  // Exports the server's metrics into `metrics` (which must outlive the
  // service): per tier budget, bytes and chunks, NVMe bytes read and written,
  // bytes pushed and pulled, and a histogram of chunk apply times.
  void ExportMetrics(Metrics* metrics);
  // The longest a pull waits for its chunk's next step (default 10 min);
  // call before serving.
  void set_max_pull_wait(absl::Duration wait) { max_pull_wait_ = wait; }
  // Called (on a step executor thread; it must not block) after an apply
  // finds a chunk's state lost (Chunk::lost()), so that the coordinator
  // hears of it; call before serving.
  void set_on_chunk_lost(std::function<void()> on_lost) { on_chunk_lost_ = std::move(on_lost); }
  // Makes the channel through which SeedChunks reads the source server at
  // `address` as a worker of the job whose token is `worker_token` (empty:
  // no credentials). Without one, SeedChunks is FAILED_PRECONDITION. Call
  // before serving.
  using SourceDialer = std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(
      const std::string& address, const std::string& worker_token)>;
  void set_source_dialer(SourceDialer dial) { dial_source_ = std::move(dial); }
  // The job whose AllocateChunks carried `digest` as its worker token's.
  std::optional<std::string> JobOfToken(absl::string_view digest) const override;

  grpc::ServerUnaryReactor* AllocateChunks(grpc::CallbackServerContext* ctx,
                                           const v1::AllocateChunksRequest* request,
                                           v1::AllocateChunksResponse* response) override;
  grpc::ServerUnaryReactor* DropJob(grpc::CallbackServerContext* ctx,
                                    const v1::DropJobRequest* request,
                                    v1::DropJobResponse* response) override;
  grpc::ServerUnaryReactor* WriteParams(grpc::CallbackServerContext* ctx,
                                        const v1::WriteParamsRequest* request,
                                        v1::WriteParamsResponse* response) override;
  grpc::ServerUnaryReactor* WriteState(grpc::CallbackServerContext* ctx,
                                       const v1::WriteStateRequest* request,
                                       v1::WriteStateResponse* response) override;
  // A PushRequest in, a PushResponse out, as raw buffers: the gradients
  // stay where gRPC received them until their step is applied.
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CommitStep(grpc::CallbackServerContext* ctx,
                                       const v1::CommitStepRequest* request,
                                       v1::CommitStepResponse* response) override;
  // A PullRequest in, a PullResponse out, as raw buffers (ShardServerService).
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // A ReadStateRequest in, a ReadStateResponse out, as raw buffers.
  grpc::ServerUnaryReactor* ReadState(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListChunks(grpc::CallbackServerContext* ctx,
                                       const v1::ListChunksRequest* request,
                                       v1::ListChunksResponse* response) override;
  grpc::ServerUnaryReactor* SaveChunks(grpc::CallbackServerContext* ctx,
                                       const v1::SaveChunksRequest* request,
                                       v1::SaveChunksResponse* response) override;
  grpc::ServerUnaryReactor* LoadChunks(grpc::CallbackServerContext* ctx,
                                       const v1::LoadChunksRequest* request,
                                       v1::LoadChunksResponse* response) override;
  grpc::ServerUnaryReactor* SeedChunks(grpc::CallbackServerContext* ctx,
                                       const v1::SeedChunksRequest* request,
                                       v1::SeedChunksResponse* response) override;
  grpc::ServerUnaryReactor* ReadStepLog(grpc::CallbackServerContext* ctx,
                                        const v1::ReadStepLogRequest* request,
                                        v1::ReadStepLogResponse* response) override;

 private:
  // Saves one host- or GPU-memory chunk of `job_id` for SaveMemoryChunks().
  absl::Status SaveMemoryChunk(const std::string& job_id, uint64_t begin, Chunk& chunk);
  ShardService(Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata, ThreadPool* executor,
               ThreadPool* nvme_executor, StateArena* checkpoint_arena,
               std::string saved_chunks_dir, std::optional<PathRoot> checkpoint_root);
  // `dir` of a checkpoint request resolved inside the checkpoint root:
  // INVALID_ARGUMENT outside it, FAILED_PRECONDITION without a root.
  absl::StatusOr<std::string> CheckpointDir(const std::string& dir) const;
  // File `name` of a checkpoint directory CheckpointDir() gave, opened
  // beneath the checkpoint root.
  RootedPath CheckpointFile(const std::string& dir, const std::string& name) const;
  // The staging buffers of a job's NVMe chunks, from the host tier.
  absl::StatusOr<std::unique_ptr<StagingPool>> MakeStagingPool(const v1::JobSpec& spec);
  // The staging buffers a recovered job's chunks share, made for the first
  // chunk that needs them: the NVMe chunks' and the GPU chunks'.
  struct StagingPools {
    std::shared_ptr<StagingPool> nvme;
    std::shared_ptr<StagingPool> gpu;
  };
  // The state of a chunk of a previous run's job `spec`, from its record:
  // loaded into memory from the file a clean shutdown saved, or restored on
  // the NVMe tier.
  absl::StatusOr<std::unique_ptr<ChunkState>> RecoverState(const v1::JobSpec& spec,
                                                           const internal::ChunkRecord& record,
                                                           DType dtype, StagingPools* pools);
  // Rebuilds a job of a previous run from its chunk records.
  absl::Status Recover(const v1::AllocateChunksRequest& request);
  absl::Status DoAllocate(const v1::AllocateChunksRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // A job this server does not have, its chunks `placed` (PlaceAll's):
  // records it and adds it.
  absl::Status AddNewJob(const v1::AllocateChunksRequest& request, DType dtype, ShardJob placed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What TakeOutChunks() took out of a job this server has: the request
  // less the chunks the job keeps, how many went, and the first error
  // deleting their records.
  struct TakenOut {
    v1::AllocateChunksRequest added;
    int dropped = 0;
    absl::Status records;
  };
  // The first half of an allocation of a job this server has: takes out
  // the chunks the request leaves out or seeds anew (their calls end
  // ABORTED). FAILED_PRECONDITION for another spec or worker token.
  absl::StatusOr<TakenOut> TakeOutChunks(const v1::AllocateChunksRequest& request, ShardJob* job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The second half: adds the chunks `placed` (PlaceAll's of taken.added,
  // which returned `placed_status`) and records the chunks the job has with
  // the larger min_generation. On error (the new chunks did not fit) the
  // job keeps the request's chunks it had.
  absl::Status AddChunks(const v1::AllocateChunksRequest& request, const TakenOut& taken,
                         const absl::Status& placed_status, ShardJob placed, ShardJob* job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the records of chunks made for job `job_id` that was dropped
  // while they were (their memory goes with `placed`).
  void ForgetPlaced(const std::string& job_id, const ShardJob& placed);
  // Places every chunk of `request` in `job`, fastest tier first, and writes
  // their records; RESOURCE_EXHAUSTED naming the free bytes of each tier
  // when they do not fit (`job` then has no chunks).
  absl::Status PlaceAll(const v1::AllocateChunksRequest& request, const FlatLayout& layout,
                        DType dtype, ShardJob* job);
  // The tiers this server has, fastest first.
  std::vector<Tier*> Tiers() const;
  // A chunk state of job `spec` in memory: GPU memory if it fits, else
  // host memory. GPU states share the job's staging buffers in `gpu_staging`,
  // made for the first (one per executor thread, one spare, from the host
  // tier); without room for them the state goes to host memory. With
  // `to_fill` the state is about to be written whole and then settled
  // (ChunkState::Settle): host memory is faulted in by those writes.
  absl::StatusOr<std::unique_ptr<ChunkState>> MakeMemoryState(
      const v1::JobSpec& spec, StateShape shape, DType dtype,
      std::shared_ptr<StagingPool>* gpu_staging, bool to_fill);
  // Makes every chunk of `request` (its job laid out as `layout`) in `job`:
  // copies in host memory, states in memory, then (with `staging`) on NVMe.
  // On error `job` has no chunks.
  absl::Status PlaceChunks(const v1::AllocateChunksRequest& request, const FlatLayout& layout,
                           DType dtype, std::shared_ptr<StagingPool> staging, ShardJob* job);
  absl::Status DoWriteParams(const v1::WriteParamsRequest& request);
  absl::Status DoWriteState(const v1::WriteStateRequest& request);
  // DoWriteState() of a stored_state.
  absl::Status DoWriteStoredState(const v1::WriteStateRequest& request);
  // The chunk a push goes to, after checking everything but the step rules
  // (`request`'s fields but its grads, of which it has `grads_bytes`).
  absl::StatusOr<std::shared_ptr<Chunk>> ValidatePush(const v1::PushRequest& request,
                                                      uint64_t grads_bytes);
  // Commits a step's scalars to every chunk of the job here, scheduling the
  // apply of those that are ready; the first chunk's error.
  absl::Status DoCommitStep(const v1::CommitStepRequest& request);
  // The ReadStateResponse to `request`, as a buffer.
  absl::StatusOr<grpc::ByteBuffer> DoReadState(const v1::ReadStateRequest& request);
  // The chunk of `job_id` that holds all of [begin, begin + n): NOT_FOUND for
  // an unknown job or a range no chunk here holds, INVALID_ARGUMENT for an
  // empty range or one that crosses a chunk boundary. Sets the job's dtype
  // and the oldest generation whose pushes it takes, when asked.
  absl::StatusOr<std::shared_ptr<Chunk>> FindChunk(const std::string& job_id, uint64_t begin,
                                                   uint64_t n, DType* dtype = nullptr,
                                                   uint64_t* min_generation = nullptr);
  // UNAVAILABLE once BeginShutdown() has run.
  absl::Status ServingStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleApply(std::shared_ptr<Chunk> chunk);
  // The chunks of a known job (NOT_FOUND otherwise), in flat order; sets the
  // oldest generation whose pushes the job takes, when asked.
  absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ChunksOf(const std::string& job_id,
                                                               uint64_t* min_generation = nullptr);
  // Adds `job` to jobs_, reserving in the checkpoint arena the pieces its
  // saves take at once: a state per chunk in memory (host or GPU tier; an
  // NVMe-tier chunk's copy is taken when a save needs it, as the state is
  // on NVMe for want of memory). DropJob gives them back.
  void AddJob(std::shared_ptr<ShardJob> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves (again) the pieces of `job`'s chunks in memory in the checkpoint arena.
  void ReserveCheckpointPieces(ShardJob* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a chunk of `job_id` here awaits its seed (Chunk::awaiting_seed).
  bool AwaitsSeed(const std::string& job_id);
  // After a job is allocated (and loaded or seeded, when a load follows or
  // a seed is under way), or recovered: faults in, on a checkpoint writer,
  // the memory its saves' second buffers and copies will take
  // (StateArena::FaultInReserved), so that no save's training steps do.
  // Not while a seed runs here (a move's seeds from several sources run at
  // once, its workers paused for the fenced ones): then once the last ends.
  void FaultInCheckpointMemory(const std::string& job_id) ABSL_LOCKS_EXCLUDED(seeds_mu_);
  // Schedules the fault-in on a checkpoint writer, seeds or not.
  void ScheduleFaultIn(const std::string& job_id);
  // Schedules `seed` on a seeder, counted as running from now until it
  // returns; the fault-ins asked for meanwhile follow the last one's end.
  void ScheduleSeed(absl::AnyInvocable<void() &&> seed) ABSL_LOCKS_EXCLUDED(seeds_mu_);
  // Arms every chunk of the request, or none (the first chunk's error).
  absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ArmChunks(
      const v1::SaveChunksRequest& request);
  absl::Status DoSaveChunks(const v1::SaveChunksRequest& request,
                            const std::vector<std::shared_ptr<Chunk>>& chunks,
                            v1::SaveChunksResponse* response);
  absl::Status DoLoadChunks(const v1::LoadChunksRequest& request);
  // Each file of a LoadChunks request in `dir`: a plain name, a chunk's
  // range, and the size of its state in `precision` on disk (checked
  // before any memory is taken for it). The first file's error.
  absl::Status CheckLoadFiles(const v1::LoadChunksRequest& request, const std::string& dir,
                              StatePrecision precision) const;
  // The request's chunks as held here, in order, and the job's dtype:
  // INVALID_ARGUMENT for a chunk not exactly as allocated here or named
  // twice, for none or too many, and for a malformed source or token.
  absl::StatusOr<std::vector<v1::ChunkSpec>> ValidateSeed(const v1::SeedChunksRequest& request,
                                                          DType* dtype);
  // Seeds `chunks` (ValidateSeed's) from the request's source: from the
  // copies built aside from it, where they are, else whole.
  absl::Status DoSeedChunks(const v1::SeedChunksRequest& request,
                            const std::vector<v1::ChunkSpec>& chunks, DType dtype,
                            v1::SeedChunksResponse* response);
  // The request's source as a seed reads it, as a worker of its job:
  // FAILED_PRECONDITION without a SourceDialer; the dialer's error.
  absl::StatusOr<SeedSource> DialSource(const v1::SeedChunksRequest& request);
  // Copies of a job's chunks built aside from one source (SeedChunks with
  // prepare), by chunk id, and the job's spec (serialized) they follow.
  struct PreparedCopies {
    std::string spec;
    std::map<uint32_t, std::unique_ptr<CatchUpCopy>> by_chunk;
    absl::Time made;
  };
  // Prepared copies live until the job's next SeedChunks from their source
  // takes them, or this long.
  static constexpr absl::Duration kPreparedLifetime = absl::Minutes(5);
  // The chunks a prepare names, as chunks of the request's spec:
  // INVALID_ARGUMENT naming the field otherwise.
  absl::Status ValidatePrepare(const v1::SeedChunksRequest& request) const;
  // Builds the request's chunks aside (ValidatePrepare's): in their new
  // chunks where those are allocated here already and lend their memory,
  // the others as many as the arena has memory for; keeps them for the next
  // SeedChunks.
  absl::Status DoPrepareSeed(const v1::SeedChunksRequest& request,
                             v1::SeedChunksResponse* response);
  // Writes `copy` into `chunk` once it replayed the fenced source's last
  // steps; the copy's steps replayed.
  absl::StatusOr<uint64_t> FinishPrepared(const SeedSource& source, CatchUpCopy* copy,
                                          Chunk& chunk);
  // The new copy of chunk `c` of `job_id` allocated here and awaiting its
  // seed, or null.
  std::shared_ptr<Chunk> NewCopyHere(const std::string& job_id, const v1::ChunkSpec& c);
  // Takes the copies prepared for `job_id` from `source`, if any; drops
  // those that lived past kPreparedLifetime.
  std::unique_ptr<PreparedCopies> TakePrepared(const std::string& job_id, const std::string& source)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DoReadStepLog(const v1::ReadStepLogRequest& request,
                             v1::ReadStepLogResponse* response);

  Tier* const gpu_;
  Tier* const host_;
  NvmeTier* const nvme_;
  MetadataStore* const metadata_;
  ThreadPool* const executor_;
  ThreadPool* const nvme_executor_;
  StateArena* const checkpoint_arena_;
  const std::string saved_chunks_dir_;
  const std::optional<PathRoot> checkpoint_root_;
  // Staging buffers per job on NVMe: one per NVMe executor thread, one spare.
  const int staging_buffers_;
  // The NVMe tier's slots (null without one): as many commits at once as a
  // job has staging buffers.
  const std::unique_ptr<NvmeSlots> nvme_slots_;
  // Held by one AllocateChunks at a time, which makes its chunks without mu_.
  absl::Mutex allocate_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  // The job whose chunks AllocateChunks makes now, and whether a DropJob
  // came meanwhile (the allocation then frees them and is ABORTED).
  struct Allocation {
    std::string job_id;
    bool dropped = false;
  };
  std::optional<Allocation> allocating_ ABSL_GUARDED_BY(mu_);
  // Copies built aside, by (job, source address).
  std::map<std::pair<std::string, std::string>, std::unique_ptr<PreparedCopies>> prepared_
      ABSL_GUARDED_BY(mu_);

  // Metrics (ExportMetrics); null until then.
  std::shared_ptr<CollectFunction> collected_;
  prometheus::Counter* pushed_bytes_ = nullptr;
  prometheus::Counter* pulled_bytes_ = nullptr;
  absl::Duration max_pull_wait_ = absl::Minutes(10);
  // Pull answers gRPC holds, each keeping its chunk (and so its memory).
  const std::shared_ptr<AnswersInFlight> answers_ = std::make_shared<AnswersInFlight>();
  std::function<void()> on_chunk_lost_;
  SourceDialer dial_source_;
  prometheus::Histogram* apply_seconds_ = nullptr;
  absl::Mutex seeds_mu_;
  int seeds_running_ ABSL_GUARDED_BY(seeds_mu_) = 0;  // scheduled and not ended
  // Jobs whose checkpoint memory waits for the seeds to end, once each.
  std::set<std::string> fault_ins_waiting_ ABSL_GUARDED_BY(seeds_mu_);
  // Checkpoint saves, which wait for steps and write files, and seeds, which
  // wait for another server (last: joined first). Apart, so that a seed
  // never waits behind a save that waits for a step.
  ThreadPool checkpoint_writers_{2};
  ThreadPool seeders_{2};
};

}  // namespace strata

#endif  // STRATA_SHARD_SHARD_SERVICE_H_
