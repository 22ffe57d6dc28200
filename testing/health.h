// Test helper: what a daemon's standard gRPC health service answers.
#ifndef STRATA_TESTING_HEALTH_H_
#define STRATA_TESTING_HEALTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/grpc_util.h"

namespace strata::testing {

// The status of `service` ("": the whole server) at `target`.
inline absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> HealthOf(
    const std::string& target, const std::string& service = "") {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(target));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status s = CallUnary(stub.get(), &grpc::health::v1::Health::Stub::Check, request, &response,
                             absl::Seconds(10));
  if (!s.ok()) return s;
  return response.status();
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_HEALTH_H_
