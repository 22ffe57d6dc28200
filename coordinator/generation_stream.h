// The WatchGeneration stream: a job's generations as Membership opens them,
// to one watcher. Thread-safe (gRPC's reactor contract); each stream deletes
// itself when gRPC is done with it.
#ifndef STRATA_COORDINATOR_GENERATION_STREAM_H_
#define STRATA_COORDINATOR_GENERATION_STREAM_H_

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/membership.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

// A stream of `job_id`'s generations newer than `known`: the current one if
// newer, then each new one, watched by member `worker_id` (none when empty):
// its opening and its cancellation by the client (the process died) are
// reported to the membership (Membership::Watching, Disconnected).
// `membership` must outlive the stream.
grpc::ServerWriteReactor<v1::Generation>* NewGenerationStream(Membership* membership,
                                                              std::string job_id, uint64_t known,
                                                              std::string worker_id);

// A stream that ends at once with `status` (not OK).
grpc::ServerWriteReactor<v1::Generation>* RefusedGenerationStream(const absl::Status& status);

}  // namespace strata

#endif  // STRATA_COORDINATOR_GENERATION_STREAM_H_
