// Test helpers: a job's placement as the coordinator reports it, and the
// chunks a shard server reports.
#ifndef STRATA_TESTING_PLACEMENT_H_
#define STRATA_TESTING_PLACEMENT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/grpc_util.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata::testing {

// GetPlacement of `job` from the coordinator at `coordinator`.
inline absl::StatusOr<v1::GetPlacementResponse> Placement(const std::string& coordinator,
                                                          const std::string& job) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::GetPlacementRequest request;
  request.set_job_id(job);
  v1::GetPlacementResponse response;
  absl::Status s = CallUnary(stub.get(), &v1::Coordinator::Stub::GetPlacement, request, &response,
                             absl::Seconds(30));
  if (!s.ok()) return s;
  return response;
}

// The chunks the shard server at `server` holds of `job` (of every job when
// empty).
inline absl::StatusOr<int> ChunksOnServer(const std::string& server, const std::string& job = "") {
  auto stub = v1::ShardServer::NewStub(MakeChannel(server));
  v1::ListChunksRequest request;
  request.set_job_id(job);
  v1::ListChunksResponse response;
  absl::Status s = CallUnary(stub.get(), &v1::ShardServer::Stub::ListChunks, request, &response,
                             absl::Seconds(10));
  if (!s.ok()) return s;
  return response.chunks_size();
}

// The master state of [begin, begin + n) of `job` on the shard server at
// `server` (within one chunk, at most 1 Mi params): in FP32, or with
// `stored` in the chunk's stored form (stored_state).
inline absl::StatusOr<v1::ReadStateResponse> ReadCopy(const std::string& server,
                                                      const std::string& job, uint64_t begin,
                                                      uint64_t n, bool stored = false) {
  auto stub = v1::ShardServer::NewStub(MakeChannel(server));
  v1::ReadStateRequest request;
  request.set_job_id(job);
  request.set_flat_begin(begin);
  request.set_num_params(n);
  request.set_stored(stored);
  v1::ReadStateResponse response;
  absl::Status s = CallUnary(stub.get(), &v1::ShardServer::Stub::ReadState, request, &response,
                             absl::Seconds(30));
  if (!s.ok()) return s;
  return response;
}

// Whether every chunk of `placement` has `copies` copies, none on `not_on`.
inline bool HasCopies(const v1::GetPlacementResponse& placement, size_t copies,
                      const std::string& not_on = "") {
  std::map<uint32_t, size_t> count;
  for (const v1::PlacementRow& row : placement.rows()) {
    if (row.server_address() == not_on) return false;
    ++count[row.chunk_id()];
  }
  for (const auto& [chunk, n] : count) {
    if (n != copies) return false;
  }
  return !count.empty();
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_PLACEMENT_H_
