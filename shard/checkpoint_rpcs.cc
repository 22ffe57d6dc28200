// ShardService's checkpoint RPCs (shard_service.h): SaveChunks writes a job's
// chunks at a step while training goes on, LoadChunks restores them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/chunk_bytes.h"
#include "core/log.h"
#include "core/parallel_for.h"
#include "core/path_root.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "shard/chunk_saver.h"
#include "shard/saved_chunk.h"
#include "shard/shard_service.h"
#include "shard/state_math.h"

namespace strata {
namespace {

// Checkpoint files read at a time by LoadChunks: one file's checksum and
// copies into chunks overlap another's reads.
constexpr size_t kParallelLoads = 2;

// The file of a chunk in a checkpoint directory.
std::string CheckpointFileName(uint32_t chunk_id) {
  return absl::StrCat("chunk-", absl::Dec(chunk_id, absl::kZeroPad8), ".bin");
}

}  // namespace

void ShardService::FaultInCheckpointMemory(const std::string& job_id) {
  {
    absl::MutexLock lock(&seeds_mu_);
    if (seeds_running_ > 0) {
      fault_ins_waiting_.insert(job_id);
      return;
    }
  }
  ScheduleFaultIn(job_id);
}

void ShardService::ScheduleFaultIn(const std::string& job_id) {
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

absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ShardService::ChunksOf(
    const std::string& job_id, uint64_t* min_generation) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(ServingStatus());
  const ShardJob* job = jobs_.Find(job_id);
  if (job == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("unknown job ", Quoted(job_id), " on this shard server"));
  }
  std::vector<std::shared_ptr<Chunk>> chunks;
  for (const auto& [begin, chunk] : job->chunks_by_begin) chunks.push_back(chunk);
  if (min_generation != nullptr) *min_generation = job->record.min_generation();
  return chunks;
}

absl::StatusOr<std::string> ShardService::CheckpointDir(const std::string& dir) const {
  if (!checkpoint_root_.has_value()) {
    return absl::FailedPreconditionError(
        "this shard server takes no checkpoints: it was started without --checkpoint_root");
  }
  ASSIGN_OR_RETURN(std::string resolved, checkpoint_root_->Resolve(dir, "checkpoint directory"));
  const int fd = checkpoint_root_->OpenBeneath(resolved, O_PATH | O_DIRECTORY);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint directory ", Quoted(dir),
                                                   " is not a directory: ", std::strerror(errno)));
  }
  close(fd);
  return resolved;
}

RootedPath ShardService::CheckpointFile(const std::string& dir, const std::string& name) const {
  return RootedPath(absl::StrCat(dir, "/", name), *checkpoint_root_);
}

absl::StatusOr<std::vector<std::shared_ptr<Chunk>>> ShardService::ArmChunks(
    const v1::SaveChunksRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
  }
  // A writer thread waits this long at most: a request cannot hold one for ever.
  if (request.wait_ms() < 0 || request.wait_ms() > kMaxSaveWaitMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("wait_ms ", request.wait_ms(), " must be in [0, ", kMaxSaveWaitMs, "]"));
  }
  ASSIGN_OR_RETURN(const std::string dir, CheckpointDir(request.dir()));
  ASSIGN_OR_RETURN(auto chunks, ChunksOf(request.job_id()));
  const bool named = !request.chunk_ids().empty() || !request.checksum_chunk_ids().empty();
  const size_t num_saved = named ? request.chunk_ids_size() : chunks.size();
  if (named) {
    absl::flat_hash_map<uint32_t, std::shared_ptr<Chunk>> by_id;
    for (auto& chunk : chunks) by_id.emplace(chunk->chunk_id(), std::move(chunk));
    chunks.clear();
    for (const auto* ids : {&request.chunk_ids(), &request.checksum_chunk_ids()}) {
      for (uint32_t id : *ids) {
        auto it = by_id.find(id);
        if (it == by_id.end() || it->second == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(ids == &request.chunk_ids() ? "chunk_ids" : "checksum_chunk_ids",
                           ": chunk ", id, " of job ", Quoted(request.job_id()),
                           it == by_id.end() ? " is not on this shard server" : " is named twice"));
        }
        chunks.push_back(std::exchange(it->second, nullptr));
      }
    }
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    // The saved chunks first, then those only checksummed (no file).
    const RootedPath path = i < num_saved
                                ? CheckpointFile(dir, CheckpointFileName(chunks[i]->chunk_id()))
                                : RootedPath();
    absl::Status armed = chunks[i]->ArmCheckpoint(request.step(), checkpoint_arena_, path);
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
  // ArmChunks() put the chunks only checksummed last.
  const size_t num_saved = chunks.size() - request.checksum_chunk_ids_size();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = *chunks[i];
    if (saved[i].loss_scale.has_value()) {
      *response->mutable_loss_scale() = LossScaleToProto(*saved[i].loss_scale);
    }
    v1::CheckpointFile* file = response->add_files();
    file->mutable_chunk()->set_chunk_id(chunk.chunk_id());
    file->mutable_chunk()->set_flat_begin(chunk.range().begin);
    file->mutable_chunk()->set_num_params(chunk.range().size());
    if (i < num_saved) {
      file->set_file(CheckpointFileName(chunk.chunk_id()));
      file->set_num_bytes(chunk.state_shape().bytes());
    }
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

absl::Status ShardService::CheckLoadFiles(const v1::LoadChunksRequest& request,
                                          const std::string& dir, StatePrecision precision) const {
  for (const v1::CheckpointFile& file : request.files()) {
    if (!IsPlainFileName(file.file())) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint file name ", Quoted(file.file()), " is not a plain file name"));
    }
    const uint64_t n = file.chunk().num_params();
    const std::optional<uint64_t> end = CheckedAdd(file.chunk().flat_begin(), n);
    if (n == 0 || n > kMaxChunkNumParams || !end.has_value() || *end > kMaxModelParams) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint file ", Quoted(file.file()), ": range [",
                       file.chunk().flat_begin(), ", +", n, ") is not a chunk (1 to ",
                       kMaxChunkNumParams, " parameters within the first ", kMaxModelParams, ")"));
    }
    // The size before any memory is taken for the file.
    const RootedPath path = CheckpointFile(dir, file.file());
    const int fd = path.Open(O_RDONLY);
    struct stat st {};
    const bool readable = fd >= 0 && fstat(fd, &st) == 0;
    const std::string error = readable ? "" : std::strerror(errno);
    if (fd >= 0) close(fd);
    const uint64_t want = StateBytes(n, precision);
    if (!readable || static_cast<uint64_t>(st.st_size) != want) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file ", path.path(),
          !readable ? " is missing or unreadable: " + error
                    : absl::StrCat(" has ", st.st_size, " bytes, not the ", want, " of its ", n,
                                   " ", StatePrecisionName(precision), "-state parameters")));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardService::DoLoadChunks(const v1::LoadChunksRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", request.step(), " must be >= 0"));
  }
  ASSIGN_OR_RETURN(const StatePrecision file_precision,
                   StatePrecisionFromProto(request.state_precision()));
  ASSIGN_OR_RETURN(const std::string dir, CheckpointDir(request.dir()));
  RETURN_IF_ERROR(CheckLoadFiles(request, dir, file_precision));
  ASSIGN_OR_RETURN(auto chunks, ChunksOf(request.job_id()));
  // Parameters of each local chunk the files cover.
  std::vector<std::atomic<uint64_t>> covered(chunks.size());
  // Each loading thread's buffers, reused while the files' sizes repeat: the
  // file's state, and its FP32 form where a chunk loads it converted.
  struct Buffer {
    StateBuffer state, fp32;
    uint64_t num_params = 0;
  };
  std::vector<Buffer> buffers(kParallelLoads);
  RETURN_IF_ERROR(ParallelFor(
      request.files_size(), kParallelLoads, [&](size_t thread, size_t f) -> absl::Status {
        const v1::CheckpointFile& file = request.files(f);
        const uint64_t n = file.chunk().num_params();
        const FlatRange source{file.chunk().flat_begin(), file.chunk().flat_begin() + n};
        const StateShape shape{n, file_precision};
        const RootedPath path = CheckpointFile(dir, file.file());
        // A file that is a chunk's state as stored is read straight into it.
        for (size_t i = 0; i < chunks.size(); ++i) {
          const FlatRange target = chunks[i]->range();
          if (target.begin != source.begin || target.end != source.end ||
              chunks[i]->state_shape().precision != file_precision) {
            continue;
          }
          covered[i] += n;
          return chunks[i]->WriteStoredState(request.step(), [&](std::byte* state) {
            return LoadChunkState(path, file.checksum(), shape.bytes(), state);
          });
        }
        Buffer& buffer = buffers[thread];
        if (buffer.num_params != n) {
          buffer.state = AllocateStateBuffer(shape.bytes());
          buffer.fp32.reset();
          buffer.num_params = n;
        }
        RETURN_IF_ERROR(LoadChunkState(path, file.checksum(), shape.bytes(), buffer.state.get()));
        bool converted = false;  // buffer.fp32 holds this file
        for (size_t i = 0; i < chunks.size(); ++i) {
          const FlatRange target = chunks[i]->range();
          const uint64_t begin = std::max(source.begin, target.begin);
          const uint64_t end = std::min(source.end, target.end);
          if (begin >= end) continue;
          covered[i] += end - begin;
          const StateShape fp32{n, StatePrecision::kFp32};
          std::byte* values = buffer.state.get();
          if (file_precision != StatePrecision::kFp32) {
            if (buffer.fp32 == nullptr) buffer.fp32 = AllocateStateBuffer(fp32.bytes());
            if (!converted) ConvertState(shape, buffer.state.get(), fp32, buffer.fp32.get());
            converted = true;
            values = buffer.fp32.get();
          }
          const StateView view = fp32.ViewOf(values);
          const uint64_t offset = begin - source.begin;
          RETURN_IF_ERROR(chunks[i]->WriteState(begin, view.p + offset, view.m + offset,
                                                view.v + offset, end - begin, request.step()));
        }
        return absl::OkStatus();
      }));
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (covered[i] != chunks[i]->range().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's files cover ", covered[i].load(), " of the ",
                       chunks[i]->range().size(), " parameters of chunk ", chunks[i]->chunk_id()));
    }
    // Allocated to be filled by this load (loads_checkpoint): pinned now.
    RETURN_IF_ERROR(chunks[i]->SettleState());
  }
  LogEventCat("server", "job ", request.job_id(), ": loaded ", chunks.size(), " chunk(s) at step ",
              request.step(), " from ", request.files_size(), " checkpoint file(s) in ",
              request.dir());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShardService::LoadChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadChunksRequest* request,
                                                   v1::LoadChunksResponse*) {
  absl::Status loaded = DoLoadChunks(*request);
  if (loaded.ok()) FaultInCheckpointMemory(request->job_id());
  return FinishUnary(ctx, loaded);
}

}  // namespace strata
