// Test helpers: a job's placement as the coordinator reports it, and the
// chunks a shard server reports.
#ifndef STRATA_TESTING_PLACEMENT_H_
#define STRATA_TESTING_PLACEMENT_H_

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

}  // namespace strata::testing

#endif  // STRATA_TESTING_PLACEMENT_H_
