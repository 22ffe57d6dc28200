// ShardTransport: a worker's traffic with the shard servers of its job. It
// cuts ranges of the flat space into pieces (each within one chunk, with the
// chunk's server), writes and reads the master state piece by piece, and runs
// a step's pushes and pulls concurrently within windows of bytes in flight.
// stratactl uses it to read a job's state too.
//
// Thread-safety: CancelGeneration() may be called from any thread (the
// client's membership thread does); every other method from one thread at a
// time.
#ifndef STRATA_CLIENT_SHARD_TRANSPORT_H_
#define STRATA_CLIENT_SHARD_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/flat_layout.h"
#include "strata/types.h"
#include "strata/v1/coordinator.pb.h"
#include "strata/v1/shard.grpc.pb.h"

#include "rpc/tls.h"

namespace strata {

// A shard server as a worker calls it.
struct ServerStubs {
  grpc::Channel* channel;
  v1::ShardServer::Stub* stub;  // over `channel`
  grpc::GenericStub* generic;   // over `channel`: the step's calls (rpc/step_wire.h)
  std::string address;
};

// A range of the flat space that lies within one chunk, and the servers of
// the chunk's copies: the primary (pulls and reads) first, then the
// replicas. Pushes and writes go to every copy.
struct Piece {
  uint64_t begin;
  uint64_t n;
  std::vector<ServerStubs> copies;
  const ServerStubs& primary() const { return copies.front(); }
};

// What every push of a step carries besides its gradients.
struct PushScalars {
  float coef;  // the gradients' multiplier
  v1::LossScaleState loss_scale_after;
  std::optional<float> lr;       // unset: the job's
  std::vector<float> group_lrs;  // per parameter group, in place of lr; empty: lr for all
};

class StepExchange;

// One step's pushes and pulls over `pieces` (PushPull).
struct StepTransfer {
  int64_t step = 0;
  uint64_t generation = 0;
  uint32_t attempt = 0;  // the step's try within the generation
  const std::vector<Piece>* pieces = nullptr;
  // Pushes `grads` (flat index `grads_base` at grads[0]) with these
  // scalars; null: pulls only.
  const PushScalars* push = nullptr;
  const uint8_t* grads = nullptr;
  uint64_t grads_base = 0;
  // Pulled parameters land here, flat index `params_base` at params[0].
  uint8_t* params = nullptr;
  uint64_t params_base = 0;
  // Pushes and pulls each keep at most this many bytes in flight.
  uint64_t window_bytes = 0;
  absl::Duration timeout;  // of the transfer, calls sent again included
};

class ShardTransport {
 public:
  // `layout` must outlive the transport; `dtype` is the job's; channels to
  // the servers are made with `tls` and present the job's worker token
  // (JobInfo.worker_token) where it has one.
  ShardTransport(std::string job_id, const FlatLayout* layout, DType dtype, TlsFiles tls);
  ShardTransport(const ShardTransport&) = delete;
  ShardTransport& operator=(const ShardTransport&) = delete;

  // Takes `job`'s placement, with a stub for each of its servers; INTERNAL
  // when it has another number of chunks than the layout, INVALID_ARGUMENT
  // for unusable TLS files.
  absl::Status SetPlacement(v1::JobInfo job);
  const v1::JobInfo& job() const { return job_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }

  // Pieces of `range`, each within one chunk and at most `max_params` long.
  std::vector<Piece> PiecesOf(FlatRange range, uint64_t max_params) const;

  // Sends one request per piece of the whole flat space (at most
  // kMaxPayloadBytes of `bytes_per_param` each) to every copy of its chunk
  // with `method`, after `fill(piece, &request)` adds the piece's values.
  // The first error, naming the server.
  template <typename Request, typename Response, typename Fill>
  absl::Status SendPieces(uint64_t bytes_per_param,
                          grpc::Status (v1::ShardServer::Stub::*method)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                          Fill fill, absl::Duration timeout);

  // p, m and v of the whole flat space, all at one step: a chunk read while
  // the job is between two steps is read again (ABORTED when the job keeps
  // changing steps for ~5 s). A server's error, naming it.
  absl::StatusOr<MasterState> ReadMasterState(absl::Duration timeout) const;

  // Pushes and pulls `transfer`'s pieces (client/step_exchange.h: in flat
  // order, concurrently, each stream within its window, calls refused by a
  // restarting server sent again); returns once all are done or one failed
  // (the others are then cancelled), with the first error naming its
  // server. ABORTED when the generation is cancelled.
  absl::Status PushPull(const StepTransfer& transfer);

  // Commits `push`'s scalars for `step` of pushes in (`generation`,
  // `attempt`) to every server of the job, one call each: the first error,
  // naming its server.
  absl::Status CommitStep(int64_t step, uint64_t generation, uint32_t attempt,
                          const PushScalars& push, absl::Duration timeout) const;

  // Ends the step exchange of `generation` in progress with ABORTED; calls
  // of `generation` fail at once from now on (a worker of it was lost).
  void CancelGeneration(uint64_t generation);

 private:
  const std::string job_id_;
  const FlatLayout* const layout_;
  const DType dtype_;
  const size_t esize_;
  const TlsFiles tls_;
  // Made by SetPlacement with the job's worker token; null until then.
  ChannelCredentials credentials_;
  std::string credentials_token_;  // the token credentials_ present
  v1::JobInfo job_;
  struct Server {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ShardServer::Stub> stub;
    std::unique_ptr<grpc::GenericStub> generic;
  };
  std::map<std::string, Server> servers_;  // by address

  static absl::Status LostGeneration(const StepTransfer& transfer);

  absl::Mutex inflight_mu_;
  // The exchange PushPull() runs; null between steps.
  StepExchange* running_ ABSL_GUARDED_BY(inflight_mu_) = nullptr;
  // The generation in which a worker was lost: its calls fail at once.
  uint64_t lost_generation_ ABSL_GUARDED_BY(inflight_mu_) = 0;
};

template <typename Request, typename Response, typename Fill>
absl::Status ShardTransport::SendPieces(
    uint64_t bytes_per_param,
    grpc::Status (v1::ShardServer::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    Fill fill, absl::Duration timeout) {
  for (const Piece& piece :
       PiecesOf({0, layout_->num_params()}, kMaxPayloadBytes / bytes_per_param)) {
    Request request;
    request.set_job_id(job_id_);
    request.set_flat_begin(piece.begin);
    fill(piece, &request);
    for (const ServerStubs& server : piece.copies) {
      Response response;
      absl::Status s = CallUnary(server.stub, method, request, &response, timeout);
      if (!s.ok()) return WithShardAddress(s, server.address);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata

#endif  // STRATA_CLIENT_SHARD_TRANSPORT_H_
