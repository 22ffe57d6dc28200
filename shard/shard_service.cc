#include "shard/shard_service.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/step_wire.h"
#include "shard/state_math.h"

namespace strata {
namespace {

// OK, or FAILED_PRECONDITION naming the first chunk of `request` (not seeded
// anew) missing from `held` (by flat begin; null: the job is not here).
absl::Status CheckChunksHeld(const v1::AllocateChunksRequest& request,
                             const std::map<uint64_t, std::shared_ptr<Chunk>>* held) {
  const std::set<uint32_t> seeded = SeededChunkIds(request);
  for (const v1::ChunkSpec& c : request.chunks()) {
    if (seeded.count(c.chunk_id()) > 0 || (held != nullptr && held->count(c.flat_begin()) > 0)) {
      continue;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("chunks_held: chunk ", c.chunk_id(), " of job '", request.spec().job_id(),
                     "' is not on this shard server (it restarted without it)"));
  }
  return absl::OkStatus();
}

}  // namespace

ShardService::ShardService(Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata,
                           ThreadPool* executor, ThreadPool* nvme_executor,
                           StateArena* checkpoint_arena, std::string saved_chunks_dir,
                           std::optional<PathRoot> checkpoint_root)
    : gpu_(gpu),
      host_(host),
      nvme_(nvme),
      metadata_(metadata),
      executor_(executor),
      nvme_executor_(nvme_executor),
      checkpoint_arena_(checkpoint_arena),
      saved_chunks_dir_(std::move(saved_chunks_dir)),
      checkpoint_root_(std::move(checkpoint_root)),
      staging_buffers_(nvme_executor == nullptr ? 0 : nvme_executor->num_threads() + 1),
      nvme_slots_(nvme == nullptr ? nullptr : std::make_unique<NvmeSlots>(nvme, staging_buffers_)) {
}

absl::StatusOr<std::unique_ptr<ShardService>> ShardService::Create(
    Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata, ThreadPool* executor,
    ThreadPool* nvme_executor, StateArena* checkpoint_arena, std::string saved_chunks_dir,
    std::optional<PathRoot> checkpoint_root) {
  if (nvme != nullptr && nvme_executor == nullptr) {
    return absl::InvalidArgumentError("an NVMe tier needs an NVMe executor");
  }
  std::error_code error;
  std::filesystem::create_directories(saved_chunks_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", saved_chunks_dir, ": ", error.message()));
  }
  std::unique_ptr<ShardService> service(
      new ShardService(gpu, host, nvme, metadata, executor, nvme_executor, checkpoint_arena,
                       std::move(saved_chunks_dir), std::move(checkpoint_root)));
  ASSIGN_OR_RETURN(auto records, ReadJobRecords(metadata));
  for (const v1::AllocateChunksRequest& record : records) {
    absl::Status recovered = service->Recover(record);
    const std::string& job_id = record.spec().job_id();
    if (recovered.ok()) {
      service->FaultInCheckpointMemory(record.spec().job_id());
      continue;
    }
    LogEventCat("server", "discarding job ", job_id, " of a previous run: ", recovered.message());
    RETURN_IF_ERROR(DeleteJobRecords(metadata, job_id));
  }
  return service;
}

void ShardService::BeginShutdown() {
  std::vector<std::shared_ptr<ShardJob>> jobs;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    status = ServingStatus();
    jobs = jobs_.All();
  }
  for (auto& job : jobs) {
    for (auto& [begin, chunk] : job->chunks_by_begin) {
      chunk->FailWaiters(status);
      chunk->CancelCheckpoint();
    }
  }
}

absl::Status ShardService::ServingStatus() const {
  if (shutting_down_) return absl::UnavailableError("shard server is shutting down");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Chunk>> ShardService::FindChunk(const std::string& job_id,
                                                               uint64_t begin, uint64_t n,
                                                               DType* dtype,
                                                               uint64_t* min_generation) {
  if (n == 0) return absl::InvalidArgumentError("the range is empty (num_params is 0)");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ServingStatus());
  const ShardJob* job = jobs_.Find(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("unknown job ", Quoted(job_id), " on this shard server"));
  }
  const auto& chunks = job->chunks_by_begin;
  auto it = chunks.upper_bound(begin);
  if (it == chunks.begin() || std::prev(it)->second->range().end <= begin) {
    return absl::NotFoundError(absl::StrCat("no chunk of job '", job_id,
                                            "' on this shard server holds flat index ", begin));
  }
  std::shared_ptr<Chunk> chunk = std::prev(it)->second;
  if (n > chunk->range().end - begin) {
    return absl::InvalidArgumentError(absl::StrCat("range [", begin, ", ", begin + n,
                                                   ") crosses the end of chunk ", chunk->chunk_id(),
                                                   " at ", chunk->range().end));
  }
  if (dtype != nullptr) *dtype = job->dtype;
  if (min_generation != nullptr) *min_generation = job->record.min_generation();
  return chunk;
}

absl::Status ShardService::DoAllocate(const v1::AllocateChunksRequest& request) {
  ASSIGN_OR_RETURN(FlatLayout layout, ValidateJobSpec(request.spec()));
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request.spec().dtype()));
  const std::string& job_id = request.spec().job_id();
  for (int i = 0; i < request.chunks_size(); ++i) {
    const v1::ChunkSpec& c = request.chunks(i);
    if (i > 0 && c.chunk_id() <= request.chunks(i - 1).chunk_id()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks: chunk ", c.chunk_id(), " follows chunk ",
                       request.chunks(i - 1).chunk_id(), " (ids must increase)"));
    }
    FlatRange range =
        c.chunk_id() < layout.num_chunks() ? layout.chunk_range(c.chunk_id()) : FlatRange{};
    if (range.empty() || range.begin != c.flat_begin() || range.size() != c.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk_id(), " [", c.flat_begin(),
                                                     ", +", c.num_params(),
                                                     ") is not a chunk of job '", job_id, "'"));
    }
  }
  // One allocation at a time, its chunks made outside mu_: the server's
  // other calls (other jobs' steps, this job's chunks that stay) never wait
  // while their memory is cleared and pinned.
  absl::MutexLock serial(&allocate_mu_);
  const ShardJob* job = nullptr;
  TakenOut taken;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(ServingStatus());
    ShardJob* held = jobs_.Find(job_id);
    if (request.chunks_held()) {
      RETURN_IF_ERROR(CheckChunksHeld(request, held == nullptr ? nullptr : &held->chunks_by_begin));
    }
    if (held != nullptr && held->record.SerializeAsString() == request.SerializeAsString()) {
      return absl::OkStatus();  // a retry
    }
    if (held == nullptr) {
      taken.added = request;
    } else {
      ASSIGN_OR_RETURN(taken, TakeOutChunks(request, held));
    }
    job = held;
    allocating_ = Allocation{job_id, /*dropped=*/false};
  }
  ShardJob placed;
  const absl::Status placed_status = PlaceAll(taken.added, layout, dtype, &placed);
  const std::set<uint32_t> seeded = SeededChunkIds(request);
  for (const auto& [begin, chunk] : placed.chunks_by_begin) {
    if (seeded.count(chunk->chunk_id()) > 0) chunk->AwaitSeed();
  }
  std::vector<std::shared_ptr<Chunk>> kept;
  {
    absl::MutexLock lock(&mu_);
    ShardJob* held = jobs_.Find(job_id);
    const bool dropped_meanwhile = allocating_->dropped || held != job;
    allocating_.reset();
    if (dropped_meanwhile) {
      ForgetPlaced(job_id, placed);
      return absl::AbortedError(
          absl::StrCat("job '", job_id, "' was dropped while its chunks were allocated"));
    }
    if (held == nullptr) {
      RETURN_IF_ERROR(placed_status);
      return AddNewJob(request, dtype, std::move(placed));
    }
    RETURN_IF_ERROR(AddChunks(request, taken, placed_status, std::move(placed), held));
    for (const auto& [begin, chunk] : held->chunks_by_begin) kept.push_back(chunk);
  }
  const absl::Time deadline = absl::Now() + kMaxFenceWait;
  for (const auto& chunk : kept) {
    RETURN_IF_ERROR(chunk->Fence(request.min_generation(), deadline).status());
  }
  return absl::OkStatus();
}

absl::Status ShardService::PlaceAll(const v1::AllocateChunksRequest& request,
                                    const FlatLayout& layout, DType dtype, ShardJob* job) {
  // The fastest tier first: every state in GPU memory while it lasts, then
  // host memory, if all fit there; else the NVMe staging buffers first, GPU
  // and host memory while they last, the rest on NVMe. (Not tried when the
  // bytes alone cannot fit: a try allocates and zeroes memory until it runs
  // out.)
  const StatePrecision precision = StatePrecisionOf(request.spec());
  uint64_t all_bytes = 0;
  for (const v1::ChunkSpec& c : request.chunks()) {
    all_bytes += ChunkBytes(c.num_params(), dtype, precision);
  }
  uint64_t memory_free_bytes = host_->budget_bytes() - host_->used_bytes();
  if (gpu_ != nullptr && precision == StatePrecision::kFp32) {
    memory_free_bytes += gpu_->budget_bytes() - gpu_->used_bytes();
  }
  absl::Status placed =
      all_bytes <= memory_free_bytes
          ? PlaceChunks(request, layout, dtype, nullptr, job)
          : absl::ResourceExhaustedError("the chunks' states do not fit in memory");
  if (!placed.ok() && nvme_ != nullptr) {
    absl::StatusOr<std::unique_ptr<StagingPool>> staging = MakeStagingPool(request.spec());
    placed = staging.ok() ? PlaceChunks(request, layout, dtype, *std::move(staging), job)
                          : staging.status();
  }
  for (auto& [begin, chunk] : job->chunks_by_begin) {
    if (placed.ok()) placed = chunk->WriteRecord();
  }
  if (placed.ok()) return placed;
  job->chunks_by_begin.clear();
  std::string free;
  for (Tier* tier : Tiers()) {
    absl::StrAppend(&free, free.empty() ? "" : ", ", TierKindName(tier->kind()), " tier ",
                    tier->budget_bytes() - tier->used_bytes(), " of ", tier->budget_bytes(),
                    " bytes free");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("job '", request.spec().job_id(), "' (", request.chunks_size(),
                   " chunks) does not fit on this shard server (", free, "): ", placed.message()));
}

absl::Status ShardService::AddNewJob(const v1::AllocateChunksRequest& request, DType dtype,
                                     ShardJob placed) {
  const std::string& job_id = request.spec().job_id();
  RETURN_IF_ERROR(WriteJobRecord(metadata_, request));
  auto job = std::make_shared<ShardJob>(std::move(placed));
  job->record = request;
  job->dtype = dtype;
  std::map<TierKind, int> per_tier;
  for (const auto& [begin, chunk] : job->chunks_by_begin) ++per_tier[chunk->tier()];
  AddJob(std::move(job));
  std::string counts;
  for (const auto& [kind, count] : per_tier) {
    absl::StrAppend(&counts, counts.empty() ? "" : ", ", count, " in the ", TierKindName(kind),
                    " tier");
  }
  LogEventCat("server", "job ", job_id, ": allocated ", request.chunks_size(), " chunks (", counts,
              ")");
  return absl::OkStatus();
}

absl::StatusOr<ShardService::TakenOut> ShardService::TakeOutChunks(
    const v1::AllocateChunksRequest& request, ShardJob* job) {
  const std::string& job_id = request.spec().job_id();
  if (job->record.spec().SerializeAsString() != request.spec().SerializeAsString() ||
      job->record.worker_token_sha256() != request.worker_token_sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' is on this shard server with another spec or worker token"));
  }
  // First out: the chunks the request leaves out or seeds anew (their
  // memory makes room); their calls end ABORTED.
  const std::set<uint32_t> seeded = SeededChunkIds(request);
  std::set<uint64_t> kept;
  for (const v1::ChunkSpec& c : request.chunks()) {
    if (seeded.count(c.chunk_id()) == 0) kept.insert(c.flat_begin());
  }
  const absl::Status left =
      absl::AbortedError(absl::StrCat("job '", job_id, "': the chunk left this shard server"));
  TakenOut taken;
  for (auto it = job->chunks_by_begin.begin(); it != job->chunks_by_begin.end();) {
    if (kept.count(it->first) > 0) {
      ++it;
      continue;
    }
    taken.records.Update(metadata_->Delete(Chunk::RecordKey(job_id, it->second->chunk_id())));
    it->second->FailWaiters(left);
    it->second->CancelCheckpoint();
    it = job->chunks_by_begin.erase(it);
    ++taken.dropped;
  }
  taken.added = request;
  taken.added.clear_chunks();
  for (const v1::ChunkSpec& c : request.chunks()) {
    if (job->chunks_by_begin.count(c.flat_begin()) == 0) *taken.added.add_chunks() = c;
  }
  return taken;
}

absl::Status ShardService::AddChunks(const v1::AllocateChunksRequest& request,
                                     const TakenOut& taken, const absl::Status& placed_status,
                                     ShardJob placed, ShardJob* job) {
  const std::string& job_id = request.spec().job_id();
  job->chunks_by_begin.merge(placed.chunks_by_begin);
  // The record names the chunks the job has here now.
  v1::AllocateChunksRequest record = request;
  record.set_min_generation(std::max(request.min_generation(), job->record.min_generation()));
  if (!placed_status.ok()) {
    record.clear_chunks();
    record.clear_seeded_chunk_ids();
    for (const v1::ChunkSpec& c : request.chunks()) {
      if (job->chunks_by_begin.count(c.flat_begin()) > 0) *record.add_chunks() = c;
    }
  }
  absl::Status recorded = taken.records;
  recorded.Update(WriteJobRecord(metadata_, record));
  job->record = std::move(record);
  // The new reservations first: the pieces kept for the chunks that stay
  // are still needed when the old ones go, and are not freed (to be faulted
  // in again).
  const std::vector<uint64_t> before = std::move(job->checkpoint_pieces);
  ReserveCheckpointPieces(job);
  checkpoint_arena_->Unreserve(before);
  LogEventCat("server", "job ", job_id, ": ", job->chunks_by_begin.size(), " chunks here (",
              placed_status.ok() ? taken.added.chunks_size() : 0, " added, ", taken.dropped,
              " dropped); pushes of generations before ", job->record.min_generation(), " refused");
  return placed_status.ok() ? recorded : placed_status;
}

void ShardService::ForgetPlaced(const std::string& job_id, const ShardJob& placed) {
  for (const auto& [begin, chunk] : placed.chunks_by_begin) {
    metadata_->Delete(Chunk::RecordKey(job_id, chunk->chunk_id())).IgnoreError();
  }
  LogEventCat("server", "job ", job_id, ": dropped while ", placed.chunks_by_begin.size(),
              " chunks were allocated for it; they are freed");
}

grpc::ServerUnaryReactor* ShardService::AllocateChunks(grpc::CallbackServerContext* ctx,
                                                       const v1::AllocateChunksRequest* request,
                                                       v1::AllocateChunksResponse*) {
  absl::Status allocated = DoAllocate(*request);
  // A load or a seed under way writes the new chunks first (LoadChunks and
  // SeedChunks fault the memory in once they end).
  const std::string& job_id = request->spec().job_id();
  if (allocated.ok() && !request->loads_checkpoint() && !AwaitsSeed(job_id)) {
    FaultInCheckpointMemory(job_id);
  }
  return FinishUnary(ctx, allocated);
}

bool ShardService::AwaitsSeed(const std::string& job_id) {
  absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> chunks = ChunksOf(job_id);
  return chunks.ok() && std::any_of(chunks->begin(), chunks->end(),
                                    [](const auto& chunk) { return chunk->awaiting_seed(); });
}

std::optional<std::string> ShardService::JobOfToken(absl::string_view digest) const {
  absl::MutexLock lock(&mu_);
  return jobs_.JobOfToken(digest);
}

void ShardService::ReserveCheckpointPieces(ShardJob* job) {
  job->checkpoint_pieces.clear();
  for (const auto& [begin, chunk] : job->chunks_by_begin) {
    if (chunk->tier() == TierKind::kNvme) continue;
    job->checkpoint_pieces.push_back(chunk->state_shape().bytes());
  }
  checkpoint_arena_->Reserve(job->checkpoint_pieces);
}

void ShardService::AddJob(std::shared_ptr<ShardJob> job) {
  ReserveCheckpointPieces(job.get());
  jobs_.Add(std::move(job));
}

grpc::ServerUnaryReactor* ShardService::DropJob(grpc::CallbackServerContext* ctx,
                                                const v1::DropJobRequest* request,
                                                v1::DropJobResponse*) {
  std::shared_ptr<ShardJob> job;
  {
    absl::MutexLock lock(&mu_);
    job = jobs_.Remove(request->job_id());
    // The allocation under way honours the drop once its chunks are made.
    if (allocating_.has_value() && allocating_->job_id == request->job_id()) {
      allocating_->dropped = true;
      if (job == nullptr) return FinishUnary(ctx, absl::OkStatus());
    }
  }
  if (job == nullptr) {
    return FinishUnary(
        ctx, absl::NotFoundError(
                 absl::StrCat("unknown job ", Quoted(request->job_id()), " on this shard server")));
  }
  absl::Status status = absl::AbortedError(absl::StrCat("job '", request->job_id(), "' dropped"));
  for (auto& [begin, chunk] : job->chunks_by_begin) {
    chunk->FailWaiters(status);
    chunk->CancelCheckpoint();  // a SaveChunks that waits for the job's step ends
  }
  checkpoint_arena_->Unreserve(job->checkpoint_pieces);
  const absl::Status s = DeleteJobRecords(metadata_, request->job_id());
  LogEventCat("server", "job ", request->job_id(), ": dropped");
  return FinishUnary(ctx, s);
}

absl::Status ShardService::DoWriteParams(const v1::WriteParamsRequest& request) {
  for (float x : request.params()) {
    if (!std::isfinite(x)) return absl::InvalidArgumentError("parameters must be finite");
  }
  ASSIGN_OR_RETURN(auto chunk,
                   FindChunk(request.job_id(), request.flat_begin(), request.params_size()));
  return chunk->WriteParams(request.flat_begin(), request.params().data(), request.params_size());
}

grpc::ServerUnaryReactor* ShardService::WriteParams(grpc::CallbackServerContext* ctx,
                                                    const v1::WriteParamsRequest* request,
                                                    v1::WriteParamsResponse*) {
  return FinishUnary(ctx, DoWriteParams(*request));
}

absl::Status ShardService::DoWriteState(const v1::WriteStateRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
  }
  if (!request.stored_state().empty() || request.num_params() != 0) {
    return DoWriteStoredState(request);
  }
  const int n = request.params_size();
  if (request.exp_avg_size() != n || request.exp_avg_sq_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("params, exp_avg and exp_avg_sq have ", n, ", ", request.exp_avg_size(),
                     " and ", request.exp_avg_sq_size(), " values; they must have as many"));
  }
  for (const auto* values : {&request.params(), &request.exp_avg(), &request.exp_avg_sq()}) {
    for (float x : *values) {
      if (!std::isfinite(x)) return absl::InvalidArgumentError("the state must be finite");
    }
  }
  for (float x : request.exp_avg_sq()) {
    if (x < 0) return absl::InvalidArgumentError("exp_avg_sq must not be negative");
  }
  ASSIGN_OR_RETURN(auto chunk, FindChunk(request.job_id(), request.flat_begin(), n));
  return chunk->WriteState(request.flat_begin(), request.params().data(), request.exp_avg().data(),
                           request.exp_avg_sq().data(), n, request.step(),
                           request.previous_params());
}

absl::Status ShardService::DoWriteStoredState(const v1::WriteStateRequest& request) {
  if (request.params_size() != 0 || request.exp_avg_size() != 0 || request.exp_avg_sq_size() != 0) {
    return absl::InvalidArgumentError(
        "stored_state comes in place of params, exp_avg and exp_avg_sq, not with them");
  }
  const uint64_t n = request.num_params();
  ASSIGN_OR_RETURN(auto chunk, FindChunk(request.job_id(), request.flat_begin(), n));
  const StateShape shape{n, chunk->state_shape().precision};
  if (request.stored_state().size() != shape.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stored_state: ", request.stored_state().size(), " bytes; the state of num_params ", n,
        " with ", StatePrecisionName(shape.precision), " moments takes ", shape.bytes()));
  }
  const auto* stored = reinterpret_cast<const std::byte*>(request.stored_state().data());
  RETURN_IF_ERROR(CheckStoredState(shape, stored, "stored_state"));
  return chunk->WriteStoredState(request.flat_begin(), n, request.step(), request.previous_params(),
                                 stored);
}

grpc::ServerUnaryReactor* ShardService::WriteState(grpc::CallbackServerContext* ctx,
                                                   const v1::WriteStateRequest* request,
                                                   v1::WriteStateResponse*) {
  return FinishUnary(ctx, DoWriteState(*request));
}

absl::StatusOr<grpc::ByteBuffer> ShardService::DoReadState(const v1::ReadStateRequest& request) {
  constexpr uint64_t kMaxReadParams = uint64_t{1} << 20;
  if (request.num_params() > kMaxReadParams) {
    return absl::InvalidArgumentError(absl::StrCat("read of ", request.num_params(),
                                                   " params exceeds the maximum of ",
                                                   kMaxReadParams, " per request"));
  }
  ASSIGN_OR_RETURN(auto chunk,
                   FindChunk(request.job_id(), request.flat_begin(), request.num_params()));
  if (request.stored()) {
    const uint64_t n = request.num_params();
    return StoredStateResponseBuffer(
        StateBytes(n, chunk->state_shape().precision), [&](uint8_t* out) {
          return chunk->CopyState(request.flat_begin(), n, reinterpret_cast<std::byte*>(out));
        });
  }
  v1::ReadStateResponse response;
  int n = static_cast<int>(request.num_params());
  response.mutable_params()->Resize(n, 0.0f);
  response.mutable_exp_avg()->Resize(n, 0.0f);
  response.mutable_exp_avg_sq()->Resize(n, 0.0f);
  ASSIGN_OR_RETURN(int64_t step, chunk->ReadState(request.flat_begin(), n,
                                                  response.mutable_params()->mutable_data(),
                                                  response.mutable_exp_avg()->mutable_data(),
                                                  response.mutable_exp_avg_sq()->mutable_data()));
  response.set_applied_step(step);
  return MessageBuffer(response);
}

grpc::ServerUnaryReactor* ShardService::ReadState(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* raw_request,
                                                  grpc::ByteBuffer* response) {
  v1::ReadStateRequest request;
  if (!ParseMessageBuffer(*raw_request, &request)) {
    return FinishUnary(ctx, absl::InvalidArgumentError("the state read request does not parse"));
  }
  absl::StatusOr<grpc::ByteBuffer> read = DoReadState(request);
  if (read.ok()) *response = *std::move(read);
  return FinishUnary(ctx, read.status());
}

grpc::ServerUnaryReactor* ShardService::ListChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::ListChunksRequest* request,
                                                   v1::ListChunksResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<ShardJob>& job : jobs_.All()) {
    const std::string& job_id = job->record.spec().job_id();
    if (!request->job_id().empty() && request->job_id() != job_id) continue;
    for (const auto& [begin, chunk] : job->chunks_by_begin) {
      v1::ChunkStatus* row = response->add_chunks();
      row->set_job_id(job_id);
      row->mutable_chunk()->set_chunk_id(chunk->chunk_id());
      row->mutable_chunk()->set_flat_begin(chunk->range().begin);
      row->mutable_chunk()->set_num_params(chunk->range().size());
      row->set_tier(TierKindName(chunk->tier()));
      row->set_num_bytes(chunk->num_bytes());
      row->set_applied_step(chunk->applied_step());
      row->set_staged_params(chunk->staged_params());
      row->set_waiting_pulls(chunk->waiting_pulls());
      if (std::optional<PushRound> round = chunk->applied_round(); round.has_value()) {
        row->mutable_applied_round()->set_generation(round->generation);
        row->mutable_applied_round()->set_attempt(round->attempt);
      }
      if (absl::Status lost = chunk->lost(); !lost.ok()) row->set_lost(std::string(lost.message()));
    }
  }
  return FinishUnary(ctx, absl::OkStatus());
}

}  // namespace strata
