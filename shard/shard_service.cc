#include "shard/shard_service.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/parallel_for.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "shard/chunk_saver.h"
#include "shard/gpu_chunk_state.h"
#include "shard/saved_chunk.h"

namespace strata {
namespace {

constexpr char kJobPrefix[] = "job/";
// Checkpoint files read at a time by LoadChunks: one file's checksum and
// copies into chunks overlap another's reads.
constexpr size_t kParallelLoads = 2;

// The file of a chunk in a checkpoint directory.
std::string CheckpointFileName(uint32_t chunk_id) {
  return absl::StrCat("chunk-", absl::Dec(chunk_id, absl::kZeroPad8), ".bin");
}

}  // namespace

ShardService::ShardService(Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata,
                           ThreadPool* executor, ThreadPool* nvme_executor,
                           StateArena* checkpoint_arena, std::string saved_chunks_dir)
    : gpu_(gpu),
      host_(host),
      nvme_(nvme),
      metadata_(metadata),
      executor_(executor),
      nvme_executor_(nvme_executor),
      checkpoint_arena_(checkpoint_arena),
      saved_chunks_dir_(std::move(saved_chunks_dir)),
      staging_buffers_(nvme_executor == nullptr ? 0 : nvme_executor->num_threads() + 1) {}

absl::StatusOr<std::unique_ptr<ShardService>> ShardService::Create(
    Tier* gpu, Tier* host, NvmeTier* nvme, MetadataStore* metadata, ThreadPool* executor,
    ThreadPool* nvme_executor, StateArena* checkpoint_arena, std::string saved_chunks_dir) {
  if (nvme != nullptr && nvme_executor == nullptr) {
    return absl::InvalidArgumentError("an NVMe tier needs an NVMe executor");
  }
  std::error_code error;
  std::filesystem::create_directories(saved_chunks_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", saved_chunks_dir, ": ", error.message()));
  }
  std::unique_ptr<ShardService> service(new ShardService(gpu, host, nvme, metadata, executor,
                                                         nvme_executor, checkpoint_arena,
                                                         std::move(saved_chunks_dir)));
  ASSIGN_OR_RETURN(auto records, metadata->Scan(kJobPrefix));
  for (const auto& [key, value] : records) {
    v1::AllocateChunksRequest record;
    if (!record.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("server metadata: cannot parse record ", key));
    }
    absl::Status recovered = service->Recover(record);
    const std::string& job_id = record.spec().job_id();
    if (recovered.ok()) {
      service->FaultInCheckpointMemory(record.spec().job_id());
      continue;
    }
    LogEventCat("server", "discarding job ", job_id, " of a previous run: ", recovered.message());
    RETURN_IF_ERROR(metadata->Delete(key));
    RETURN_IF_ERROR(metadata->DeletePrefix(Chunk::RecordPrefix(job_id)));
  }
  return service;
}

absl::StatusOr<std::unique_ptr<StagingPool>> ShardService::MakeStagingPool(
    const v1::JobSpec& spec) {
  return StagingPool::Create(host_, NvmeChunkState::StagingBytes(spec.chunk_num_params()),
                             staging_buffers_);
}

absl::Status ShardService::Recover(const v1::AllocateChunksRequest& request) {
  const std::string& job_id = request.spec().job_id();
  ASSIGN_OR_RETURN(auto records, metadata_->Scan(Chunk::RecordPrefix(job_id)));
  if (records.size() != static_cast<size_t>(request.chunks_size())) {
    return absl::FailedPreconditionError(
        absl::StrCat(request.chunks_size() - static_cast<int>(records.size()),
                     " of its chunks were in host memory, which survives only a clean shutdown"));
  }
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request.spec().dtype()));
  std::shared_ptr<StagingPool> staging;      // made for the first NVMe chunk
  std::shared_ptr<StagingPool> gpu_staging;  // made for the first GPU chunk
  auto job = std::make_shared<Job>();
  job->record = request;
  job->dtype = dtype;
  const AdamConfig adam = AdamFromProto(request.spec().adam());
  int64_t step = -1;
  std::vector<std::string> saved_files;
  for (const auto& [key, value] : records) {
    v1::ChunkRecord record;
    if (!record.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("server metadata: cannot parse record ", key));
    }
    const uint64_t n = record.chunk().num_params();
    std::unique_ptr<ChunkState> state;
    if (!record.saved_file().empty()) {
      ASSIGN_OR_RETURN(state, MakeMemoryState(request.spec(), n, dtype, &gpu_staging));
      ASSIGN_OR_RETURN(StateView view, state->Load());
      absl::Status loaded = LoadChunkState(record.saved_file(), record.saved_checksum(), n, view.p);
      if (loaded.ok()) loaded = state->Commit(view);
      state->Release(view);
      RETURN_IF_ERROR(loaded);
      saved_files.push_back(record.saved_file());
    } else {
      if (nvme_ == nullptr) {
        return absl::FailedPreconditionError("its chunks were on an NVMe tier this server lacks");
      }
      if (staging == nullptr) {
        ASSIGN_OR_RETURN(staging, MakeStagingPool(request.spec()));
      }
      ASSIGN_OR_RETURN(state, NvmeChunkState::Restore(nvme_, staging, record));
    }
    ASSIGN_OR_RETURN(Extent copy, host_->Allocate(ChunkCopyBytes(n, dtype)));
    uint64_t begin = record.chunk().flat_begin();
    auto chunk = std::make_shared<Chunk>(job_id, record.chunk().chunk_id(),
                                         FlatRange{begin, begin + n}, dtype, adam, std::move(state),
                                         host_, copy, metadata_, record.applied_step());
    RETURN_IF_ERROR(chunk->RebuildCopy());
    job->chunks_by_begin[begin] = std::move(chunk);
    step = step < 0 ? record.applied_step() : std::min(step, record.applied_step());
  }
  // The saved states live in memory again: their records and files go, so
  // that a later crash cannot bring back these steps.
  for (const auto& [begin, chunk] : job->chunks_by_begin) {
    if (chunk->tier() != TierKind::kNvme) {
      RETURN_IF_ERROR(metadata_->Delete(Chunk::RecordKey(job_id, chunk->chunk_id())));
    }
  }
  for (const std::string& file : saved_files) std::filesystem::remove(file);
  absl::MutexLock lock(&mu_);
  AddJob(std::move(job));
  LogEventCat("server", "recovered job ", job_id, ": ", records.size() - saved_files.size(),
              " chunks from the nvme tier and ", saved_files.size(),
              " saved at the last clean shutdown, at step ", step);
  return absl::OkStatus();
}

void ShardService::SaveMemoryChunks() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) jobs.push_back(job);
  }
  for (const auto& job : jobs) {
    const std::string& job_id = job->record.spec().job_id();
    int saved = 0;
    absl::Status status;
    for (const auto& [begin, chunk] : job->chunks_by_begin) {
      if (chunk->tier() == TierKind::kNvme) continue;  // durable already
      const uint64_t n = chunk->range().size();
      StateBuffer state = AllocateStateBuffer(n);
      absl::StatusOr<int64_t> step =
          chunk->ReadState(begin, n, state.get(), state.get() + n, state.get() + 2 * n);
      std::string file = absl::StrCat(saved_chunks_dir_, "/", job_id, "-", chunk->chunk_id());
      absl::StatusOr<uint64_t> checksum =
          step.ok() ? SaveChunkState(file, state.get(), n) : step.status();
      if (checksum.ok()) {
        v1::ChunkRecord record;
        record.mutable_chunk()->set_chunk_id(chunk->chunk_id());
        record.mutable_chunk()->set_flat_begin(begin);
        record.mutable_chunk()->set_num_params(n);
        record.set_tier(TierKindName(TierKind::kHost));
        record.set_saved_file(file);
        record.set_saved_checksum(*checksum);
        record.set_applied_step(*step);
        status = metadata_->Put(Chunk::RecordKey(job_id, chunk->chunk_id()),
                                record.SerializeAsString(), /*sync=*/true);
      } else {
        status = checksum.status();
      }
      if (!status.ok()) break;
      ++saved;
    }
    if (!status.ok()) {
      LogEventCat("server", "job ", job_id, ": cannot save its chunks held in memory (",
                  status.ToString(), "); the job will be discarded at the next start");
    } else if (saved > 0) {
      LogEventCat("server", "job ", job_id, ": saved ", saved, " chunk(s) held in memory to ",
                  saved_chunks_dir_);
    }
  }
}

void ShardService::BeginShutdown() {
  std::vector<std::shared_ptr<Job>> jobs;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    status = ServingStatus();
    for (auto& [id, job] : jobs_) jobs.push_back(job);
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
  auto job_it = jobs_.find(job_id);
  if (job_it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "' on this shard server"));
  }
  const auto& chunks = job_it->second->chunks_by_begin;
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
  if (dtype != nullptr) *dtype = job_it->second->dtype;
  if (min_generation != nullptr) *min_generation = job_it->second->record.min_generation();
  return chunk;
}

std::vector<Tier*> ShardService::Tiers() const {
  std::vector<Tier*> tiers;
  for (Tier* tier : {gpu_, host_, static_cast<Tier*>(nvme_)}) {
    if (tier != nullptr) tiers.push_back(tier);
  }
  return tiers;
}

absl::StatusOr<std::unique_ptr<ChunkState>> ShardService::MakeMemoryState(
    const v1::JobSpec& spec, uint64_t num_params, DType dtype,
    std::shared_ptr<StagingPool>* gpu_staging) {
  if (gpu_ != nullptr && *gpu_staging == nullptr) {
    absl::StatusOr<std::unique_ptr<StagingPool>> pool = StagingPool::Create(
        host_, GpuStagingBytes(spec.chunk_num_params(), dtype), executor_->num_threads() + 1);
    if (pool.ok()) *gpu_staging = *std::move(pool);
  }
  if (*gpu_staging != nullptr) {
    absl::StatusOr<std::unique_ptr<ChunkState>> state =
        CreateGpuChunkState(gpu_, *gpu_staging, num_params, dtype);
    if (state.ok() || state.status().code() != absl::StatusCode::kResourceExhausted) return state;
  }
  return HostChunkState::Create(host_, num_params);
}

absl::Status ShardService::PlaceChunks(const v1::AllocateChunksRequest& request, DType dtype,
                                       std::shared_ptr<StagingPool> staging, Job* job) {
  const std::string& job_id = request.spec().job_id();
  const AdamConfig adam = AdamFromProto(request.spec().adam());
  // Copies first: every chunk's copy is in host memory whatever its tier.
  std::vector<Extent> copies;
  std::shared_ptr<StagingPool> gpu_staging;  // made for the first GPU chunk
  absl::Status status;
  for (const v1::ChunkSpec& c : request.chunks()) {
    absl::StatusOr<Extent> copy = host_->Allocate(ChunkCopyBytes(c.num_params(), dtype));
    if (!copy.ok()) {
      status = copy.status();
      break;
    }
    copies.push_back(*copy);
  }
  for (int i = 0; status.ok() && i < request.chunks_size(); ++i) {
    const v1::ChunkSpec& c = request.chunks(i);
    absl::StatusOr<std::unique_ptr<ChunkState>> state =
        MakeMemoryState(request.spec(), c.num_params(), dtype, &gpu_staging);
    if (!state.ok() && staging != nullptr) {
      state = NvmeChunkState::Create(nvme_, staging, c.num_params());
    }
    if (!state.ok()) {
      status = state.status();
      break;
    }
    job->chunks_by_begin[c.flat_begin()] = std::make_shared<Chunk>(
        job_id, c.chunk_id(), FlatRange{c.flat_begin(), c.flat_begin() + c.num_params()}, dtype,
        adam, *std::move(state), host_, copies[i], metadata_);
  }
  if (!status.ok()) {
    // Chunks made so far free their copies; the rest are freed here.
    for (size_t i = job->chunks_by_begin.size(); i < copies.size(); ++i) host_->Free(copies[i]);
    job->chunks_by_begin.clear();
  }
  return status;
}

absl::Status ShardService::DoAllocate(const v1::AllocateChunksRequest& request) {
  ASSIGN_OR_RETURN(FlatLayout layout, ValidateJobSpec(request.spec()));
  ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(request.spec().dtype()));
  const std::string& job_id = request.spec().job_id();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ServingStatus());
  if (auto it = jobs_.find(job_id); it != jobs_.end()) {
    if (it->second->record.SerializeAsString() == request.SerializeAsString()) {
      return absl::OkStatus();  // a retry
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' already has other chunks on this shard server"));
  }
  for (const v1::ChunkSpec& c : request.chunks()) {
    FlatRange range =
        c.chunk_id() < layout.num_chunks() ? layout.chunk_range(c.chunk_id()) : FlatRange{};
    if (range.empty() || range.begin != c.flat_begin() || range.size() != c.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk_id(), " [", c.flat_begin(),
                                                     ", +", c.num_params(),
                                                     ") is not a chunk of job '", job_id, "'"));
    }
  }
  auto job = std::make_shared<Job>();
  job->record = request;
  job->dtype = dtype;
  // The fastest tier first: every state in GPU memory while it lasts, then
  // host memory, if all fit there; else the NVMe staging buffers first, GPU
  // and host memory while they last, the rest on NVMe. (Not tried when the
  // bytes alone cannot fit: a try allocates and zeroes memory until it runs
  // out.)
  uint64_t all_bytes = 0;
  for (const v1::ChunkSpec& c : request.chunks()) {
    all_bytes += ChunkBytes(c.num_params(), dtype);
  }
  uint64_t memory_free_bytes = host_->budget_bytes() - host_->used_bytes();
  if (gpu_ != nullptr) memory_free_bytes += gpu_->budget_bytes() - gpu_->used_bytes();
  absl::Status placed =
      all_bytes <= memory_free_bytes
          ? PlaceChunks(request, dtype, nullptr, job.get())
          : absl::ResourceExhaustedError("the chunks' states do not fit in memory");
  if (!placed.ok() && nvme_ != nullptr) {
    absl::StatusOr<std::unique_ptr<StagingPool>> staging = MakeStagingPool(request.spec());
    placed = staging.ok() ? PlaceChunks(request, dtype, *std::move(staging), job.get())
                          : staging.status();
  }
  for (auto& [begin, chunk] : job->chunks_by_begin) {
    if (placed.ok()) placed = chunk->WriteRecord();
  }
  if (!placed.ok()) {
    std::string free;
    for (Tier* tier : Tiers()) {
      absl::StrAppend(&free, free.empty() ? "" : ", ", TierKindName(tier->kind()), " tier ",
                      tier->budget_bytes() - tier->used_bytes(), " of ", tier->budget_bytes(),
                      " bytes free");
    }
    return absl::ResourceExhaustedError(absl::StrCat("job '", job_id, "' (", request.chunks_size(),
                                                     " chunks) does not fit on this shard server (",
                                                     free, "): ", placed.message()));
  }
  RETURN_IF_ERROR(metadata_->Put(absl::StrCat(kJobPrefix, job_id), request.SerializeAsString()));
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

grpc::ServerUnaryReactor* ShardService::AllocateChunks(grpc::CallbackServerContext* ctx,
                                                       const v1::AllocateChunksRequest* request,
                                                       v1::AllocateChunksResponse*) {
  absl::Status allocated = DoAllocate(*request);
  if (allocated.ok()) FaultInCheckpointMemory(request->spec().job_id());
  return FinishUnary(ctx, allocated);
}

void ShardService::AddJob(std::shared_ptr<Job> job) {
  for (const auto& [begin, chunk] : job->chunks_by_begin) {
    if (chunk->tier() == TierKind::kNvme) continue;
    job->checkpoint_pieces.push_back(StateBytes(chunk->range().size()));
  }
  checkpoint_arena_->Reserve(job->checkpoint_pieces);
  jobs_[job->record.spec().job_id()] = std::move(job);
}

void ShardService::FaultInCheckpointMemory(const std::string& job_id) {
  checkpoint_writers_.Schedule([this, job_id] {
    const absl::Time started = absl::Now();
    const StateArena::FaultedIn faulted_in = checkpoint_arena_->FaultInReserved();
    if (faulted_in.short_bytes > 0) {
      LogEventCat("server", "job ", job_id, ": the checkpoint memory limit of ",
                  FormatBytes(checkpoint_arena_->limit_bytes()), " leaves ",
                  FormatBytes(faulted_in.short_bytes),
                  " of what this server's jobs' saves take unallocated: saves will fault it in "
                  "during training steps, or have training steps write chunks to the checkpoint "
                  "(raise --checkpoint_memory_limit_mib to avoid it)");
    }
    if (faulted_in.allocated_bytes == 0) return;
    LogEventCat("server", "job ", job_id, ": ", FormatBytes(faulted_in.allocated_bytes),
                " of memory faulted in for its checkpoints in ",
                absl::FormatDuration(absl::Now() - started), " (",
                FormatBytes(checkpoint_arena_->held_bytes()), " held of the ",
                FormatBytes(checkpoint_arena_->limit_bytes()), " limit)");
  });
}

grpc::ServerUnaryReactor* ShardService::DropJob(grpc::CallbackServerContext* ctx,
                                                const v1::DropJobRequest* request,
                                                v1::DropJobResponse*) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job_id());
    if (it != jobs_.end()) {
      job = std::move(it->second);
      jobs_.erase(it);
    }
  }
  if (job == nullptr) {
    return FinishUnary(ctx, absl::NotFoundError(absl::StrCat("unknown job '", request->job_id(),
                                                             "' on this shard server")));
  }
  absl::Status status = absl::AbortedError(absl::StrCat("job '", request->job_id(), "' dropped"));
  for (auto& [begin, chunk] : job->chunks_by_begin) chunk->FailWaiters(status);
  checkpoint_arena_->Unreserve(job->checkpoint_pieces);
  absl::Status s = metadata_->Delete(absl::StrCat(kJobPrefix, request->job_id()));
  if (s.ok()) s = metadata_->DeletePrefix(Chunk::RecordPrefix(request->job_id()));
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
  const int n = request.params_size();
  if (request.exp_avg_size() != n || request.exp_avg_sq_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("params, exp_avg and exp_avg_sq have ", n, ", ", request.exp_avg_size(),
                     " and ", request.exp_avg_sq_size(), " values; they must have as many"));
  }
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
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
                           request.exp_avg_sq().data(), n, request.step());
}

grpc::ServerUnaryReactor* ShardService::WriteState(grpc::CallbackServerContext* ctx,
                                                   const v1::WriteStateRequest* request,
                                                   v1::WriteStateResponse*) {
  return FinishUnary(ctx, DoWriteState(*request));
}

void ShardService::ScheduleApply(std::shared_ptr<Chunk> chunk) {
  ThreadPool* executor = chunk->tier() == TierKind::kNvme ? nvme_executor_ : executor_;
  executor->Schedule([this, chunk = std::move(chunk)] {
    absl::Time started = absl::Now();
    chunk->Apply();
    if (apply_seconds_ != nullptr)
      apply_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - started));
  });
}

void ShardService::ExportMetrics(Metrics* metrics) {
  prometheus::Registry& registry = metrics->registry();
  pushed_bytes_ = &prometheus::BuildCounter()
                       .Name("strata_pushed_bytes_total")
                       .Help("Gradient bytes received in pushes")
                       .Register(registry)
                       .Add({});
  pulled_bytes_ = &prometheus::BuildCounter()
                       .Name("strata_pulled_bytes_total")
                       .Help("Parameter bytes sent in pulls")
                       .Register(registry)
                       .Add({});
  apply_seconds_ = &prometheus::BuildHistogram()
                        .Name("strata_chunk_apply_seconds")
                        .Help("Time to apply one step to one chunk (load, AdamW, commit)")
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 3e-3, 1e-2,
                                                                         3e-2, 0.1, 0.3, 1, 3});
  collected_ = std::make_shared<CollectFunction>([this] {
    std::map<std::string, std::pair<uint64_t, uint64_t>> per_tier;  // chunks, bytes
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, job] : jobs_) {
        for (const auto& [begin, chunk] : job->chunks_by_begin) {
          auto& [chunks, bytes] = per_tier[TierKindName(chunk->tier())];
          ++chunks;
          bytes += chunk->num_bytes();
        }
      }
    }
    std::vector<std::pair<prometheus::Labels, double>> budget, used, chunks, io;
    for (Tier* tier : Tiers()) {
      std::string name = TierKindName(tier->kind());
      budget.push_back({{{"tier", name}}, static_cast<double>(tier->budget_bytes())});
      used.push_back({{{"tier", name}}, static_cast<double>(tier->used_bytes())});
      chunks.push_back({{{"tier", name}}, static_cast<double>(per_tier[name].first)});
    }
    if (nvme_ != nullptr) {
      io.push_back({{{"tier", "nvme"}, {"op", "read"}}, static_cast<double>(nvme_->read_bytes())});
      io.push_back(
          {{{"tier", "nvme"}, {"op", "write"}}, static_cast<double>(nvme_->written_bytes())});
    }
    using prometheus::MetricType;
    return std::vector<prometheus::MetricFamily>{
        ValueFamily(MetricType::Gauge, "strata_tier_budget_bytes", "Byte budget of each tier",
                    budget),
        ValueFamily(MetricType::Gauge, "strata_tier_used_bytes", "Bytes allocated in each tier",
                    used),
        ValueFamily(MetricType::Gauge, "strata_tier_chunks",
                    "Chunks whose state lives in each tier", chunks),
        ValueFamily(MetricType::Counter, "strata_tier_io_bytes_total",
                    "Bytes moved by tier I/O (rate() gives the bandwidth)", io),
        ValueFamily(
            MetricType::Gauge, "strata_checkpoint_memory_bytes",
            "Host memory for chunk states that checkpoints keep aside: held now "
            "(kept region, pieces out and kept), out now, what the jobs' saves take "
            "(reserved), and the limit",
            {{{{"kind", "held"}}, static_cast<double>(checkpoint_arena_->held_bytes())},
             {{{"kind", "reserved"}}, static_cast<double>(checkpoint_arena_->reserved_bytes())},
             {{{"kind", "taken"}}, static_cast<double>(checkpoint_arena_->taken_bytes())},
             {{{"kind", "limit"}}, static_cast<double>(checkpoint_arena_->limit_bytes())}}),
        ValueFamily(MetricType::Counter, "strata_checkpoint_memory_refused_bytes_total",
                    "Checkpoint memory refused for the limit: those chunks' states were written "
                    "by training steps",
                    {{{}, static_cast<double>(checkpoint_arena_->refused_bytes())}})};
  });
  metrics->Register(collected_);
}

absl::StatusOr<std::shared_ptr<Chunk>> ShardService::ValidatePush(const v1::PushRequest& request) {
  if (request.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 1"));
  }
  if (!std::isfinite(request.coef())) {
    return absl::InvalidArgumentError(absl::StrCat("coef ", request.coef(), " is not finite"));
  }
  if (request.has_lr() && !(std::isfinite(request.lr()) && request.lr() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr ", request.lr(), " must be finite and >= 0"));
  }
  ASSIGN_OR_RETURN(DType grad_dtype, DTypeFromProto(request.dtype()));
  DType job_dtype;
  uint64_t min_generation;
  ASSIGN_OR_RETURN(auto chunk, FindChunk(request.job_id(), request.flat_begin(),
                                         request.num_params(), &job_dtype, &min_generation));
  if (request.generation() < min_generation) {
    return absl::AbortedError(absl::StrCat(
        "push of generation ", request.generation(), " to job '", request.job_id(),
        "': its chunks moved here for generation ", min_generation, " on; re-form first"));
  }
  if (grad_dtype != job_dtype) {
    return absl::InvalidArgumentError(absl::StrCat("gradients are ", DTypeName(grad_dtype),
                                                   "; job '", request.job_id(), "' uses ",
                                                   DTypeName(job_dtype)));
  }
  uint64_t want_bytes = request.num_params() * DTypeSize(job_dtype);
  if (request.grads().size() != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("grads has ", request.grads().size(), " bytes; ",
                                                   request.num_params(), " ", DTypeName(job_dtype),
                                                   " gradients need ", want_bytes));
  }
  return chunk;
}

grpc::ServerUnaryReactor* ShardService::Push(grpc::CallbackServerContext* ctx,
                                             const v1::PushRequest* request,
                                             v1::PushResponse* response) {
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = ValidatePush(*request);
  if (!chunk.ok()) return FinishUnary(ctx, chunk.status());
  // The chunk reads the gradients straight from the request, which stays
  // valid until the reactor finishes: when the step is applied.
  if (pushed_bytes_ != nullptr) pushed_bytes_->Increment(request->grads().size());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<bool> complete = (*chunk)->Stage(
      request->step(), request->generation(), request->flat_begin(), request->num_params(),
      request->grads(),
      StepScalars{request->coef(),
                  request->has_lr() ? std::optional<float>(request->lr()) : std::nullopt,
                  request->has_loss_scale_after()
                      ? std::optional<v1::LossScaleState>(request->loss_scale_after())
                      : std::nullopt},
      [reactor, response, step = request->step()](absl::Status s) {
        response->set_applied_step(step);
        reactor->Finish(ToGrpcStatus(s));
      });
  if (!complete.ok()) {
    reactor->Finish(ToGrpcStatus(complete.status()));
  } else if (*complete) {
    ScheduleApply(*std::move(chunk));
  }
  return reactor;
}

grpc::ServerUnaryReactor* ShardService::Pull(grpc::CallbackServerContext* ctx,
                                             const v1::PullRequest* request,
                                             v1::PullResponse* response) {
  DType dtype;
  absl::StatusOr<std::shared_ptr<Chunk>> chunk =
      FindChunk(request->job_id(), request->flat_begin(), request->num_params(), &dtype);
  if (!chunk.ok()) return FinishUnary(ctx, chunk.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  (*chunk)->Pull(
      request->step(), request->flat_begin(), request->num_params(),
      [this, reactor, response, dtype](absl::Status s, int64_t step, absl::string_view bytes) {
        if (s.ok() && pulled_bytes_ != nullptr) pulled_bytes_->Increment(bytes.size());
        if (s.ok()) {
          response->set_step(step);
          response->set_dtype(DTypeToProto(dtype));
          response->set_params(bytes.data(), bytes.size());
        }
        reactor->Finish(ToGrpcStatus(s));
      });
  return reactor;
}

absl::Status ShardService::DoReadState(const v1::ReadStateRequest& request,
                                       v1::ReadStateResponse* response) {
  constexpr uint64_t kMaxReadParams = uint64_t{1} << 20;
  if (request.num_params() > kMaxReadParams) {
    return absl::InvalidArgumentError(absl::StrCat("read of ", request.num_params(),
                                                   " params exceeds the maximum of ",
                                                   kMaxReadParams, " per request"));
  }
  ASSIGN_OR_RETURN(auto chunk,
                   FindChunk(request.job_id(), request.flat_begin(), request.num_params()));
  int n = static_cast<int>(request.num_params());
  response->mutable_params()->Resize(n, 0.0f);
  response->mutable_exp_avg()->Resize(n, 0.0f);
  response->mutable_exp_avg_sq()->Resize(n, 0.0f);
  ASSIGN_OR_RETURN(int64_t step, chunk->ReadState(request.flat_begin(), n,
                                                  response->mutable_params()->mutable_data(),
                                                  response->mutable_exp_avg()->mutable_data(),
                                                  response->mutable_exp_avg_sq()->mutable_data()));
  response->set_applied_step(step);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShardService::ReadState(grpc::CallbackServerContext* ctx,
                                                  const v1::ReadStateRequest* request,
                                                  v1::ReadStateResponse* response) {
  return FinishUnary(ctx, DoReadState(*request, response));
}

grpc::ServerUnaryReactor* ShardService::ListChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::ListChunksRequest* request,
                                                   v1::ListChunksResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, job] : jobs_) {
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
    }
  }
  return FinishUnary(ctx, absl::OkStatus());
}

}  // namespace strata

namespace strata {

absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ShardService::ChunksOf(
    const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ServingStatus());
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "' on this shard server"));
  }
  std::vector<std::shared_ptr<Chunk>> chunks;
  for (const auto& [begin, chunk] : it->second->chunks_by_begin) chunks.push_back(chunk);
  return chunks;
}

absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ShardService::ArmChunks(
    const v1::SaveChunksRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
  }
  if (request.dir().empty() || request.dir()[0] != '/' ||
      !std::filesystem::is_directory(request.dir())) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory '", request.dir(), "' is not an absolute directory"));
  }
  ASSIGN_OR_RETURN(auto chunks, ChunksOf(request.job_id()));
  for (size_t i = 0; i < chunks.size(); ++i) {
    absl::Status armed = chunks[i]->ArmCheckpoint(
        request.step(), checkpoint_arena_,
        absl::StrCat(request.dir(), "/", CheckpointFileName(chunks[i]->chunk_id())));
    if (!armed.ok()) {
      for (size_t j = 0; j < i; ++j) chunks[j]->CancelCheckpoint();
      return armed;
    }
  }
  return chunks;
}

absl::Status ShardService::DoSaveChunks(const v1::SaveChunksRequest& request,
                                        const std::vector<std::shared_ptr<Chunk>>& chunks,
                                        v1::SaveChunksResponse* response) {
  const absl::Time wait_until = absl::Now() + absl::Milliseconds(request.wait_ms());
  for (const auto& chunk : chunks) {
    absl::Status reached = chunk->AwaitCheckpointStep(wait_until);
    if (!reached.ok()) {
      for (const auto& c : chunks) c->CancelCheckpoint();
      return reached;
    }
  }
  const absl::Time writing = absl::Now();
  ASSIGN_OR_RETURN(std::vector<SavedChunk> saved, SaveArmedChunks(chunks));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = *chunks[i];
    if (saved[i].loss_scale.has_value()) *response->mutable_loss_scale() = *saved[i].loss_scale;
    v1::CheckpointFile* file = response->add_files();
    file->mutable_chunk()->set_chunk_id(chunk.chunk_id());
    file->mutable_chunk()->set_flat_begin(chunk.range().begin);
    file->mutable_chunk()->set_num_params(chunk.range().size());
    file->set_file(CheckpointFileName(chunk.chunk_id()));
    file->set_num_bytes(StateBytes(chunk.range().size()));
    file->set_checksum(saved[i].checksum);
  }
  response->set_write_seconds(absl::ToDoubleSeconds(absl::Now() - writing));
  LogEventCat("server", "job ", request.job_id(), ": saved ", chunks.size(), " chunk(s) of step ",
              request.step(), " to ", request.dir(), " in ", response->write_seconds(),
              " s; checkpoint buffers since start-up: at most ",
              FormatBytes(checkpoint_arena_->peak_taken_bytes()), " at once, ",
              FormatBytes(checkpoint_arena_->allocated_beyond_bytes()), " allocated beyond the ",
              FormatBytes(checkpoint_arena_->retained_bytes()), " kept, ",
              FormatBytes(checkpoint_arena_->refused_bytes()), " refused for the limit of ",
              FormatBytes(checkpoint_arena_->limit_bytes()),
              " (those chunks written by training steps instead)");
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShardService::SaveChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::SaveChunksRequest* request,
                                                   v1::SaveChunksResponse* response) {
  absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> chunks = ArmChunks(*request);
  if (!chunks.ok()) return FinishUnary(ctx, chunks.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoint_writers_.Schedule([this, reactor, request, response, chunks = *std::move(chunks)] {
    reactor->Finish(ToGrpcStatus(DoSaveChunks(*request, chunks, response)));
  });
  return reactor;
}

absl::Status ShardService::DoLoadChunks(const v1::LoadChunksRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
  }
  for (const v1::CheckpointFile& file : request.files()) {
    if (file.file().empty() || file.file().find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint file name '", file.file(), "' is not a plain file name"));
    }
  }
  ASSIGN_OR_RETURN(auto chunks, ChunksOf(request.job_id()));
  // Parameters of each local chunk the files cover.
  std::vector<std::atomic<uint64_t>> covered(chunks.size());
  // Each loading thread's buffer, reused while the files' sizes repeat.
  struct Buffer {
    StateBuffer state;
    uint64_t num_params = 0;
  };
  std::vector<Buffer> buffers(kParallelLoads);
  RETURN_IF_ERROR(ParallelFor(
      request.files_size(), kParallelLoads, [&](size_t thread, size_t f) -> absl::Status {
        const v1::CheckpointFile& file = request.files(f);
        const uint64_t n = file.chunk().num_params();
        const FlatRange source{file.chunk().flat_begin(), file.chunk().flat_begin() + n};
        Buffer& buffer = buffers[thread];
        if (buffer.num_params != n) {
          buffer.state = AllocateStateBuffer(n);
          buffer.num_params = n;
        }
        float* p = buffer.state.get();
        RETURN_IF_ERROR(
            LoadChunkState(absl::StrCat(request.dir(), "/", file.file()), file.checksum(), n, p));
        for (size_t i = 0; i < chunks.size(); ++i) {
          const FlatRange target = chunks[i]->range();
          const uint64_t begin = std::max(source.begin, target.begin);
          const uint64_t end = std::min(source.end, target.end);
          if (begin >= end) continue;
          const uint64_t offset = begin - source.begin;
          RETURN_IF_ERROR(chunks[i]->WriteState(begin, p + offset, p + n + offset,
                                                p + 2 * n + offset, end - begin, request.step()));
          covered[i] += end - begin;
        }
        return absl::OkStatus();
      }));
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (covered[i] != chunks[i]->range().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's files cover ", covered[i].load(), " of the ",
                       chunks[i]->range().size(), " parameters of chunk ", chunks[i]->chunk_id()));
    }
  }
  LogEventCat("server", "job ", request.job_id(), ": loaded ", chunks.size(), " chunk(s) at step ",
              request.step(), " from ", request.files_size(), " checkpoint file(s) in ",
              request.dir());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShardService::LoadChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadChunksRequest* request,
                                                   v1::LoadChunksResponse*) {
  return FinishUnary(ctx, DoLoadChunks(*request));
}

}  // namespace strata
