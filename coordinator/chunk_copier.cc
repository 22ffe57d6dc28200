#include "coordinator/chunk_copier.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

// `status` with `address` named.
absl::Status AtServer(const absl::Status& status, const std::string& address) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("shard server ", address, ": ", status.message()));
}

}  // namespace

absl::StatusOr<CopiedChunk> CopyChunkState(v1::ShardServer::Stub* source,
                                           const std::string& source_address,
                                           v1::ShardServer::Stub* target,
                                           const std::string& target_address,
                                           const std::string& job_id, const v1::ChunkSpec& chunk,
                                           DType dtype, absl::Duration call_timeout) {
  CopiedChunk copied;
  std::optional<int64_t> step;
  const uint64_t end = chunk.flat_begin() + chunk.num_params();
  for (uint64_t begin = chunk.flat_begin(); begin < end; begin += kCopyPieceParams) {
    const uint64_t n = std::min(kCopyPieceParams, end - begin);
    v1::ReadStateRequest read;
    read.set_job_id(job_id);
    read.set_flat_begin(begin);
    read.set_num_params(n);
    v1::ReadStateResponse state;
    RETURN_IF_ERROR(
        AtServer(CallUnary(source, &v1::ShardServer::Stub::ReadState, read, &state, call_timeout),
                 source_address));
    if (step.has_value() && *step != state.applied_step()) {
      return absl::AbortedError(absl::StrCat(
          "chunk ", chunk.chunk_id(), " of job ", job_id, " on shard server ", source_address,
          " went from step ", *step, " to ", state.applied_step(), " during its copy"));
    }
    step = state.applied_step();
    v1::WriteStateRequest write;
    write.set_job_id(job_id);
    write.set_flat_begin(begin);
    write.set_step(*step);
    *write.mutable_params() = std::move(*state.mutable_params());
    *write.mutable_exp_avg() = std::move(*state.mutable_exp_avg());
    *write.mutable_exp_avg_sq() = std::move(*state.mutable_exp_avg_sq());
    // The copy of the step before, where the source keeps it (not after a
    // restart, nor at step 0): ABORTED otherwise, and the copy goes without.
    if (*step > 0 && (begin == chunk.flat_begin() || copied.previous)) {
      v1::PullRequest pull;
      pull.set_job_id(job_id);
      pull.set_step(*step - 1);
      pull.set_flat_begin(begin);
      pull.set_num_params(n);
      v1::PullResponse before;
      absl::Status pulled =
          CallUnary(source, &v1::ShardServer::Stub::Pull, pull, &before, call_timeout);
      if (pulled.ok() && before.params().size() == n * DTypeSize(dtype)) {
        write.set_previous_params(std::move(*before.mutable_params()));
        copied.previous = true;
      } else if (!absl::IsAborted(pulled)) {
        return AtServer(pulled.ok() ? absl::InternalError("a pull of the wrong size") : pulled,
                        source_address);
      } else if (copied.previous) {
        return AtServer(pulled, source_address);  // it was there for the first piece
      }
    }
    copied.bytes += 3 * n * sizeof(float) + write.previous_params().size();
    v1::WriteStateResponse written;
    RETURN_IF_ERROR(AtServer(
        CallUnary(target, &v1::ShardServer::Stub::WriteState, write, &written, call_timeout),
        target_address));
  }
  copied.step = step.value_or(0);
  return copied;
}

}  // namespace strata
