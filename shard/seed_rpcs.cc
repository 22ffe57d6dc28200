// ShardService's SeedChunks (shard_service.h): new copies of a job's chunks
// here are seeded from their copies on another server, which this server
// reads itself (shard/chunk_seeder.h).
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/host_port.h"
#include "core/log.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"
#include "rpc/token.h"
#include "shard/chunk_seeder.h"
#include "shard/shard_service.h"

namespace strata {
namespace {

// How long each read of the source may take.
constexpr absl::Duration kSeedCallTimeout = absl::Seconds(60);

}  // namespace

absl::StatusOr<std::vector<v1::ChunkSpec>> ShardService::ValidateSeed(
    const v1::SeedChunksRequest& request, DType* dtype) {
  RETURN_IF_ERROR(ValidateHostPort("source_address", request.source_address()));
  if (!request.worker_token().empty()) {
    RETURN_IF_ERROR(ValidateToken(request.worker_token(), "worker_token"));
  }
  if (request.chunks().empty() || static_cast<uint64_t>(request.chunks_size()) > kMaxChunksPerJob) {
    return absl::InvalidArgumentError(absl::StrCat("chunks: ", request.chunks_size(),
                                                   " named; 1 to ", kMaxChunksPerJob, " may be"));
  }
  std::vector<v1::ChunkSpec> chunks;
  absl::flat_hash_set<uint32_t> named;
  for (const v1::ChunkSpec& c : request.chunks()) {
    ASSIGN_OR_RETURN(std::shared_ptr<Chunk> chunk,
                     FindChunk(request.job_id(), c.flat_begin(), c.num_params(), dtype));
    if (chunk->chunk_id() != c.chunk_id() || chunk->range().begin != c.flat_begin() ||
        chunk->range().size() != c.num_params()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks: chunk ", c.chunk_id(), " [", c.flat_begin(), ", +", c.num_params(), ") of job ",
          Quoted(request.job_id()), " is not a chunk as allocated on this shard server"));
    }
    if (!named.insert(c.chunk_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks: chunk ", c.chunk_id(), " is named twice"));
    }
    chunks.push_back(c);
  }
  return chunks;
}

absl::Status ShardService::DoSeedChunks(const v1::SeedChunksRequest& request,
                                        const std::vector<v1::ChunkSpec>& chunks, DType dtype,
                                        v1::SeedChunksResponse* response) {
  if (!dial_source_) {
    return absl::FailedPreconditionError("this shard server reads no other server");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<v1::ShardServer::Stub> source,
                   dial_source_(request.source_address(), request.worker_token()));
  const absl::Time started = absl::Now();
  ASSIGN_OR_RETURN(
      SeededChunks seeded,
      SeedChunkStates(source.get(), request.source_address(), request.job_id(), chunks, dtype,
                      kSeedCallTimeout,
                      [this](const v1::WriteStateRequest& piece) { return DoWriteState(piece); }));
  response->set_bytes(seeded.bytes);
  response->set_previous(seeded.previous);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LogEventCat("server", "job ", request.job_id(), ": ", chunks.size(), " chunk copies seeded from ",
              request.source_address(), " (", FormatBytes(seeded.bytes), " in ", seconds, " s)");
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ShardService::SeedChunks(grpc::CallbackServerContext* ctx,
                                                   const v1::SeedChunksRequest* request,
                                                   v1::SeedChunksResponse* response) {
  DType dtype = DType::kFp32;
  absl::StatusOr<std::vector<v1::ChunkSpec>> chunks = ValidateSeed(*request, &dtype);
  if (!chunks.ok()) return FinishUnary(ctx, chunks.status());
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  seeders_.Schedule([this, reactor, request, response, chunks = *std::move(chunks), dtype] {
    reactor->Finish(ToGrpcStatus(DoSeedChunks(*request, chunks, dtype, response)));
  });
  return reactor;
}

}  // namespace strata
