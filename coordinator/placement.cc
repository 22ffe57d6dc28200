#include "coordinator/placement.h"

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/job_info.h"
#include "core/chunk_bytes.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

uint64_t ChunkBytesOf(const v1::ChunkSpec& chunk, v1::DType dtype) {
  return ChunkBytes(chunk.num_params(), DTypeFromProto(dtype).value_or(DType::kFp32));
}

}  // namespace

uint64_t ServerCapacityBytes(const v1::ServerRecord& server) {
  return server.gpu_budget_bytes() + server.host_budget_bytes() + server.nvme_budget_bytes() / 2;
}

absl::Status PlaceChunks(const std::vector<v1::ServerRecord>& live,
                         const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job) {
  const v1::JobSpec& spec = job->spec();
  // Bytes each live server can still take: its capacity less other jobs' chunks.
  std::map<std::string, uint64_t> free, capacity;
  for (const v1::ServerRecord& server : live) {
    free[server.address()] = capacity[server.address()] = ServerCapacityBytes(server);
  }
  if (free.empty()) return absl::FailedPreconditionError("no live shard servers are registered");
  for (const v1::JobInfo* other : placed) {
    if (other->spec().job_id() == spec.job_id()) continue;
    for (const auto& c : other->chunks()) {
      const uint64_t bytes = ChunkBytesOf(c.chunk(), other->spec().dtype());
      for (const std::string& address : CopiesOf(c)) {
        auto it = free.find(address);
        if (it != free.end()) it->second -= std::min(it->second, bytes);
      }
    }
  }
  auto share = [&](const auto& server) {
    return static_cast<double>(server.second) / std::max<uint64_t>(capacity[server.first], 1);
  };
  const uint32_t copies = std::max<uint32_t>(spec.replicas(), 1);
  if (copies > free.size()) {
    return absl::FailedPreconditionError(absl::StrCat("job '", spec.job_id(), "' wants ", copies,
                                                      " copies of each chunk on distinct "
                                                      "shard servers; ",
                                                      free.size(),
                                                      " live server(s) are registered"));
  }
  uint64_t job_bytes = 0;
  std::map<std::string, uint64_t> primary_bytes;  // the job's, per server
  for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
    a.clear_server_address();
    a.clear_replica_addresses();
    const uint64_t bytes = ChunkBytesOf(a.chunk(), spec.dtype());
    for (uint32_t copy = 0; copy < copies; ++copy) {
      job_bytes += bytes;
      auto best = free.end();
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->second >= bytes && !HoldsCopy(a, it->first) &&
            (best == free.end() || share(*it) > share(*best))) {
          best = it;
        }
      }
      if (best == free.end()) {
        uint64_t total_free = 0;
        for (const auto& [address, bytes_free] : free) total_free += bytes_free;
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", spec.job_id(), "' does not fit: it needs ", job->flat_num_params(),
            " params, at least ", job_bytes, " bytes so far of chunks of ", bytes, " bytes; the ",
            free.size(), " live shard server(s) have ", total_free, " bytes free in all"));
      }
      best->second -= bytes;
      if (copy == 0) {
        a.set_server_address(best->first);
      } else {
        a.add_replica_addresses(best->first);
      }
    }
    // The copy on the server with the fewest of the job's primary bytes so
    // far serves the pulls (the first chosen on a tie).
    for (std::string& replica : *a.mutable_replica_addresses()) {
      if (primary_bytes[replica] < primary_bytes[a.server_address()]) {
        std::string primary = a.server_address();
        a.set_server_address(replica);
        replica = std::move(primary);
      }
    }
    primary_bytes[a.server_address()] += bytes;
  }
  return absl::OkStatus();
}

}  // namespace strata
