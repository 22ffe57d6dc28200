// ShardService's SeedChunks and ReadStepLog (shard_service.h): new copies
// of a job's chunks here are seeded from their copies on another server,
// which this server reads itself: whole once the job is fenced
// (shard/chunk_seeder.h), or built aside while it trains and brought to the
// fenced source's step by replaying its step log (shard/catch_up_seeder.h).
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/host_port.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/token.h"
#include "shard/chunk_groups.h"
#include "shard/chunk_seeder.h"
#include "shard/shard_service.h"

namespace strata {
namespace {

// How long each read of the source may take.
constexpr absl::Duration kSeedCallTimeout = absl::Seconds(60);
// The most params of one ReadStepLog (its steps' gradients stay far below
// the message limit).
constexpr uint64_t kMaxStepLogReadParams = uint64_t{1} << 20;

// The checks of every SeedChunks: its source address and token, then 1 to
// kMaxChunksPerJob chunks, each `known` (its error otherwise) and named
// once.
absl::Status ValidateSeedRequest(const v1::SeedChunksRequest& request,
                                 const std::function<absl::Status(const v1::ChunkSpec&)>& known) {
  RETURN_IF_ERROR(ValidateHostPort("source_address", request.source_address()));
  if (!request.worker_token().empty()) {
    RETURN_IF_ERROR(ValidateToken(request.worker_token(), "worker_token"));
  }
  if (request.chunks().empty() || static_cast<uint64_t>(request.chunks_size()) > kMaxChunksPerJob) {
    return absl::InvalidArgumentError(absl::StrCat("chunks: ", request.chunks_size(),
                                                   " named; 1 to ", kMaxChunksPerJob, " may be"));
  }
  absl::flat_hash_set<uint32_t> named;
  for (const v1::ChunkSpec& c : request.chunks()) {
    RETURN_IF_ERROR(known(c));
    if (!named.insert(c.chunk_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks: chunk ", c.chunk_id(), " is named twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<v1::ChunkSpec>> ShardService::ValidateSeed(
    const v1::SeedChunksRequest& request, DType* dtype) {
  RETURN_IF_ERROR(ValidateSeedRequest(request, [&](const v1::ChunkSpec& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk,
                     FindChunk(request.job_id(), c.flat_begin(), c.num_params(), dtype));
    if (chunk->chunk_id() != c.chunk_id() || chunk->range().begin != c.flat_begin() ||
        chunk->range().size() != c.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks: chunk ", c.chunk_id(), " [", c.flat_begin(), ", +", c.num_params(), ") of job ",
          Quoted(request.job_id()), " is not a chunk as allocated on this shard server"));
    }
    return absl::OkStatus();
  }));
  return std::vector<v1::ChunkSpec>(request.chunks().begin(), request.chunks().end());
}

absl::StatusOr<SeedSource> ShardService::DialSource(const v1::SeedChunksRequest& request) {
  if (!dial_source_) {
    return absl::FailedPreconditionError("this shard server reads no other server");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   dial_source_(request.source_address(), request.worker_token()));
  return SeedSource{v1::ShardServer::NewStub(channel), std::make_unique<grpc::GenericStub>(channel),
                    request.source_address(), request.job_id(), kSeedCallTimeout};
}

std::shared_ptr<Chunk> ShardService::NewCopyHere(const std::string& job_id,
                                                 const v1::ChunkSpec& c) {
  absl::StatusOr<std::shared_ptr<Chunk>> chunk = FindChunk(job_id, c.flat_begin(), c.num_params());
  if (!chunk.ok() || (*chunk)->chunk_id() != c.chunk_id() ||
      (*chunk)->range().begin != c.flat_begin() || !(*chunk)->awaiting_seed()) {
    return nullptr;
  }
  return *std::move(chunk);
}

std::unique_ptr<ShardService::PreparedCopies> ShardService::TakePrepared(
    const std::string& job_id, const std::string& source) {
  absl::MutexLock lock(&mu_);
  for (auto it = prepared_.begin(); it != prepared_.end();) {
    if (absl::Now() - it->second->made > kPreparedLifetime) {
      it = prepared_.erase(it);
    } else {
      ++it;
    }
  }
  auto it = prepared_.find({job_id, source});
  if (it == prepared_.end()) return nullptr;
  std::unique_ptr<PreparedCopies> taken = std::move(it->second);
  prepared_.erase(it);
  return taken;
}

absl::StatusOr<uint64_t> ShardService::FinishPrepared(const SeedSource& source, CatchUpCopy* copy,
                                                      Chunk& chunk) {
  ASSIGN_OR_RETURN(const uint64_t replayed, CatchUp(source, copy, /*to_applied_step=*/true));
  RETURN_IF_ERROR(PullPrevious(source, copy));
  RETURN_IF_ERROR(copy->WriteInto(chunk));
  EndStepLog(source, *copy);
  return replayed;
}

absl::Status ShardService::DoSeedChunks(const v1::SeedChunksRequest& request,
                                        const std::vector<v1::ChunkSpec>& chunks, DType dtype,
                                        v1::SeedChunksResponse* response) {
  ASSIGN_OR_RETURN(const SeedSource from, DialSource(request));
  const absl::Time started = absl::Now();
  std::unique_ptr<PreparedCopies> prepared =
      TakePrepared(request.job_id(), request.source_address());
  std::string spec;
  StatePrecision precision = StatePrecision::kFp32;
  {
    absl::MutexLock lock(&mu_);
    const ShardJob* job = jobs_.Find(request.job_id());
    if (job != nullptr) {
      spec = job->record.spec().SerializeAsString();
      precision = StatePrecisionOf(job->record.spec());
    }
  }
  if (prepared != nullptr && prepared->spec != spec) prepared.reset();
  // Chunks with a copy built aside replay the last steps and are written,
  // kSeedStreams at a time (the workers wait); the others, and those whose
  // copy fell behind, are copied whole.
  struct Finish {
    CatchUpCopy* copy = nullptr;
    std::shared_ptr<Chunk> chunk;
    absl::StatusOr<uint64_t> replayed = absl::NotFoundError("no copy built aside");
  };
  std::vector<Finish> finishes(chunks.size());
  for (size_t i = 0; i < chunks.size() && prepared != nullptr; ++i) {
    const v1::ChunkSpec& c = chunks[i];
    auto it = prepared->by_chunk.find(c.chunk_id());
    if (it == prepared->by_chunk.end() || it->second->chunk().flat_begin() != c.flat_begin() ||
        it->second->chunk().num_params() != c.num_params()) {
      continue;
    }
    finishes[i].copy = it->second.get();
    ASSIGN_OR_RETURN(finishes[i].chunk,
                     FindChunk(request.job_id(), c.flat_begin(), c.num_params()));
  }
  InSeedStreams(finishes.size(), [&](size_t i) {
    Finish& f = finishes[i];
    if (f.copy != nullptr) f.replayed = FinishPrepared(from, f.copy, *f.chunk);
    return absl::OkStatus();  // a failure is copied whole
  }).IgnoreError();
  std::vector<v1::ChunkSpec> whole;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Finish& f = finishes[i];
    if (!f.replayed.ok()) {
      if (f.copy != nullptr) {
        LogEventCat("server", "job ", request.job_id(), ": the copy of chunk ",
                    chunks[i].chunk_id(),
                    " built aside is copied whole: ", f.replayed.status().ToString());
      }
      whole.push_back(chunks[i]);
      continue;
    }
    response->set_prepared(response->prepared() + 1);
    response->set_replayed_steps(response->replayed_steps() + *f.replayed);
    response->set_previous(response->previous() + (f.copy->has_previous() ? 1 : 0));
  }
  prepared.reset();  // its memory back before copies are read whole
  if (!whole.empty()) {
    ASSIGN_OR_RETURN(
        SeededChunks seeded,
        SeedChunkStates(from, whole, dtype, precision, [this](const v1::WriteStateRequest& piece) {
          return DoWriteState(piece);
        }));
    response->set_bytes(seeded.bytes);
    response->set_previous(response->previous() + seeded.previous);
  }
  // Allocated to be filled (AllocateChunksRequest.seeded_chunk_ids): pinned now.
  for (const v1::ChunkSpec& c : chunks) {
    ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk,
                     FindChunk(request.job_id(), c.flat_begin(), c.num_params()));
    RETURN_IF_ERROR(chunk->SettleState());
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LogEventCat("server", "job ", request.job_id(), ": ", chunks.size(), " chunk copies seeded from ",
              request.source_address(), " (", response->prepared(), " built aside, ",
              response->replayed_steps(), " steps replayed; ", FormatBytes(response->bytes()),
              " copied whole in ", seconds, " s)");
  return absl::OkStatus();
}

absl::Status ShardService::ValidatePrepare(const v1::SeedChunksRequest& request) const {
  absl::StatusOr<FlatLayout> layout = ValidateJobSpec(request.spec());
  if (!layout.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", layout.status().message()));
  }
  if (request.spec().job_id() != request.job_id()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.job_id ", Quoted(request.spec().job_id()),
                                                   " is not job_id ", Quoted(request.job_id())));
  }
  return ValidateSeedRequest(request, [&](const v1::ChunkSpec& c) {
    const bool known = c.chunk_id() < layout->num_chunks() &&
                       layout->chunk_range(c.chunk_id()).begin == c.flat_begin() &&
                       layout->chunk_range(c.chunk_id()).size() == c.num_params();
    return known ? absl::OkStatus()
                 : absl::InvalidArgumentError(absl::StrCat("chunks: chunk ", c.chunk_id(), " [",
                                                           c.flat_begin(), ", +", c.num_params(),
                                                           ") is not a chunk of the job's spec"));
  });
}

absl::Status ShardService::DoPrepareSeed(const v1::SeedChunksRequest& request,
                                         v1::SeedChunksResponse* response) {
  ASSIGN_OR_RETURN(const SeedSource from, DialSource(request));
  const absl::Time started = absl::Now();
  const v1::JobSpec& spec = request.spec();
  ASSIGN_OR_RETURN(const FlatLayout layout, ValidateJobSpec(spec));
  ASSIGN_OR_RETURN(const DType dtype, DTypeFromProto(spec.dtype()));
  const StatePrecision precision = StatePrecisionOf(spec);
  auto prepared = std::make_unique<PreparedCopies>();
  prepared->spec = spec.SerializeAsString();
  // Chunk by chunk, each read then replayed; the copies built so far
  // replay what their sources applied meanwhile, so that no log falls
  // StepLog::kMaxSteps behind. A job's chunks are within a step of each
  // other (workers pull every chunk of a step before pushing the next), so
  // a copy at the step of the chunk read last is at most one behind its
  // source: only copies below that step replay (one ReadStepLog per piece;
  // an idle job's copies none).
  absl::Status last_failure;
  for (const v1::ChunkSpec& c : request.chunks()) {
    const FlatRange range{c.flat_begin(), c.flat_begin() + c.num_params()};
    absl::StatusOr<std::unique_ptr<CatchUpCopy>> copy = CatchUpCopy::Create(
        c, dtype, precision, AdamFromProto(spec.adam()), ChunkGroupsOf(spec, layout, range),
        kSeedPieceParams, checkpoint_arena_, NewCopyHere(request.job_id(), c));
    if (!copy.ok()) {
      last_failure = copy.status();  // the arena is full; later chunks may lend their memory
      continue;
    }
    absl::Status read = ReadPieces(from, copy->get());
    if (!read.ok()) {
      last_failure = read;
      EndStepLog(from, **copy);
      continue;
    }
    response->set_bytes(response->bytes() + StateBytes(c.num_params(), precision));
    const int64_t read_step = (*copy)->max_step();
    prepared->by_chunk[c.chunk_id()] = *std::move(copy);
    for (auto it = prepared->by_chunk.begin(); it != prepared->by_chunk.end();) {
      if (it->second->min_step() >= read_step) {
        ++it;
        continue;
      }
      absl::StatusOr<uint64_t> replayed = CatchUp(from, it->second.get(), false);
      if (replayed.ok()) {
        response->set_replayed_steps(response->replayed_steps() + *replayed);
        ++it;
      } else {
        last_failure = replayed.status();
        EndStepLog(from, *it->second);
        it = prepared->by_chunk.erase(it);
      }
    }
  }
  // Each piece's copy of the step before, while the job trains: a piece the
  // source moves past gets it again from its replay; the others need no pull
  // once fenced (FinishPrepared), which is all of them when the job is idle.
  // A failed pull is tried again then.
  // Copies built in their chunks are written whole: pinned now, not once
  // fenced (a failure is tried again once seeded).
  for (auto& [id, copy] : prepared->by_chunk) {
    PullPrevious(from, copy.get()).IgnoreError();
    response->set_previous(response->previous() + (copy->has_previous() ? 1 : 0));
    if (!copy->in_place()) continue;
    response->set_in_place(response->in_place() + 1);
    std::shared_ptr<Chunk> chunk = NewCopyHere(request.job_id(), copy->chunk());
    if (chunk != nullptr) chunk->SettleState().IgnoreError();
  }
  response->set_prepared(static_cast<uint32_t>(prepared->by_chunk.size()));
  LogEventCat("server", "job ", request.job_id(), ": ", response->prepared(), " of ",
              request.chunks_size(), " chunk copies built aside from ", request.source_address(),
              " in ", absl::ToDoubleSeconds(absl::Now() - started), " s (", response->in_place(),
              " in their chunks; ", response->replayed_steps(), " steps replayed)",
              last_failure.ok() ? "" : "; the others are copied whole once fenced: ",
              last_failure.ok() ? "" : last_failure.ToString());
  prepared->made = absl::Now();
  absl::MutexLock lock(&mu_);
  prepared_[{request.job_id(), request.source_address()}] = std::move(prepared);
  return absl::OkStatus();
}

absl::Status ShardService::DoReadStepLog(const v1::ReadStepLogRequest& request,
                                         v1::ReadStepLogResponse* response) {
  if (request.num_params() > kMaxStepLogReadParams) {
    return absl::InvalidArgumentError(absl::StrCat("num_params: ", request.num_params(),
                                                   " exceeds the maximum of ",
                                                   kMaxStepLogReadParams, " per read"));
  }
  DType dtype = DType::kFp32;
  ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk,
                   FindChunk(request.job_id(), request.flat_begin(), request.num_params(), &dtype));
  if (request.end()) {
    chunk->EndStepLog();
    return absl::OkStatus();
  }
  std::shared_ptr<StepLog> log;
  if (request.start()) {
    log = chunk->StartStepLog();
  } else {
    ASSIGN_OR_RETURN(log, chunk->step_log());
  }
  ASSIGN_OR_RETURN(const auto steps, log->Read(request.release_through(), request.after_step()));
  response->set_since_step(log->since_step());
  response->set_applied_step(chunk->applied_step());
  const size_t esize = DTypeSize(dtype);
  const uint64_t offset = (request.flat_begin() - chunk->range().begin) * esize;
  for (const auto& step : steps) {
    v1::LoggedStep* out = response->add_steps();
    out->set_step(step->step);
    out->set_coef(step->coef);
    out->set_lr(step->lr);
    out->mutable_group_lrs()->Add(step->group_lrs.begin(), step->group_lrs.end());
    out->set_grads(step->grads.substr(offset, request.num_params() * esize));
  }
  return absl::OkStatus();
}

void ShardService::ScheduleSeed(absl::AnyInvocable<void() &&> seed) {
  {
    absl::MutexLock lock(&seeds_mu_);
    ++seeds_running_;
  }
  seeders_.Schedule([this, seed = std::move(seed)]() mutable {
    std::move(seed)();
    std::set<std::string> waiting;
    {
      absl::MutexLock lock(&seeds_mu_);
      if (--seeds_running_ == 0) waiting.swap(fault_ins_waiting_);
    }
    for (const std::string& job_id : waiting) ScheduleFaultIn(job_id);
  });
}

grpc::ServerUnaryReactor* ShardService::SeedChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::SeedChunksRequest* request,
                                                   v1::SeedChunksResponse* response) {
  if (request->prepare()) {
    if (absl::Status valid = ValidatePrepare(*request); !valid.ok()) {
      return FinishUnary(ctx, valid);
    }
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    ScheduleSeed([this, reactor, request, response] {
      reactor->Finish(ToGrpcStatus(DoPrepareSeed(*request, response)));
    });
    return reactor;
  }
  DType dtype = DType::kFp32;
  absl::StatusOr<std::vector<v1::ChunkSpec>> chunks = ValidateSeed(*request, &dtype);
  if (!chunks.ok()) return FinishUnary(ctx, chunks.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  ScheduleSeed([this, reactor, request, response, chunks = *std::move(chunks), dtype] {
    const absl::Status seeded = DoSeedChunks(*request, chunks, dtype, response);
    // Not while the copies were built: that would slow the build and the
    // training steps beside it (AllocateChunksRequest.seeded_chunk_ids).
    FaultInCheckpointMemory(request->job_id());
    reactor->Finish(ToGrpcStatus(seeded));
  });
  return reactor;
}

grpc::ServerUnaryReactor* ShardService::ReadStepLog(grpc::CallbackServerContext* ctx,
                                                    const v1::ReadStepLogRequest* request,
                                                    v1::ReadStepLogResponse* response) {
  return FinishUnary(ctx, DoReadStepLog(*request, response));
}

}  // namespace strata
