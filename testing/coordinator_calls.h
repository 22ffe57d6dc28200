// Test and bench helpers: the coordinator's job-administration RPCs
// (DrainServer, RebalanceJob, DeleteJob) as blocking calls over a
// plaintext channel of their own; each returns the RPC's status and fills
// `response`. Thread-safe: every call has its own channel.
#ifndef STRATA_TESTING_COORDINATOR_CALLS_H_
#define STRATA_TESTING_COORDINATOR_CALLS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "rpc/grpc_util.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata::testing {

// Moves every copy off the server at `address` (with `cancel`, lets it take
// copies again).
inline absl::Status DrainServer(const std::string& coordinator, const std::string& address,
                                bool cancel, v1::DrainServerResponse* response,
                                absl::Duration timeout) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::DrainServerRequest request;
  request.set_address(address);
  request.set_cancel(cancel);
  return CallUnary(stub.get(), &v1::Coordinator::Stub::DrainServer, request, response, timeout);
}

// Spreads `job_id`'s copies over the live servers.
inline absl::Status RebalanceJob(const std::string& coordinator, const std::string& job_id,
                                 v1::RebalanceJobResponse* response, absl::Duration timeout) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::RebalanceJobRequest request;
  request.set_job_id(job_id);
  return CallUnary(stub.get(), &v1::Coordinator::Stub::RebalanceJob, request, response, timeout);
}

// Deletes `job_id` (refused with FAILED_PRECONDITION while workers hold it).
inline absl::Status DeleteJob(const std::string& coordinator, const std::string& job_id,
                              v1::DeleteJobResponse* response,
                              absl::Duration timeout = absl::Seconds(30)) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return CallUnary(stub.get(), &v1::Coordinator::Stub::DeleteJob, request, response, timeout);
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_COORDINATOR_CALLS_H_
