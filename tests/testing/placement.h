// Test helper: a job's placement as the coordinator reports it.
#ifndef STRATA_TESTS_TESTING_PLACEMENT_H_
#define STRATA_TESTS_TESTING_PLACEMENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "strata/v1/coordinator.grpc.pb.h"

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

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_PLACEMENT_H_
