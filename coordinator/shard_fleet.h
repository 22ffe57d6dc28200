// ShardFleet: the coordinator's calls to the control RPCs of its shard
// servers (AllocateChunks, LoadChunks, DropJob, ListChunks). One channel per
// address, made on first use and kept. Each call goes to a set of servers at
// once and completes once all have answered (FanOut), on a gRPC thread, so a
// reactor never blocks on a server. Thread-safe.
#ifndef STRATA_COORDINATOR_SHARD_FLEET_H_
#define STRATA_COORDINATOR_SHARD_FLEET_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/fan_out.h"
#include "rpc/tls.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/coordinator.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class ShardFleet {
 public:
  // Every call to a server ends within `call_timeout`.
  // Calls servers over channels made with `credentials`.
  ShardFleet(absl::Duration call_timeout, ChannelCredentials credentials)
      : call_timeout_(call_timeout), credentials_(std::move(credentials)) {}
  ShardFleet(const ShardFleet&) = delete;
  ShardFleet& operator=(const ShardFleet&) = delete;

  // The stub of the server at `address`; valid as long as the fleet.
  v1::ShardServer::Stub* Stub(const std::string& address);
  // A server (re)started at `address`: the channel to it starts connecting
  // at once (in the background) instead of waiting out the backoff left by
  // its previous process, so that calls without wait-for-ready (SeedChunks)
  // soon reach the new one.
  void Reconnect(const std::string& address);

  // What a server does with a chunk it is to hold but lacks (and `seeded`
  // does not name): a job created has it made anew; one restored from a
  // checkpoint too, and the server waits for the load before it faults in
  // the job's checkpoint memory (AllocateChunksRequest.loads_checkpoint); a
  // copy move has the server refuse (FAILED_PRECONDITION: it restarted
  // without the chunk, which must not come back at step 0).
  enum class Absent { kMakeAnew, kMakeAnewToLoad, kRefuse };
  // Allocates the job's chunks on its servers (pushes of generations before
  // `min_generation` refused; the chunks `seeded` names per server made
  // anew, the others `absent` says), then `done(status, servers that
  // allocated)`.
  using SeededChunks = std::map<std::string, std::vector<uint32_t>>;
  void Allocate(std::shared_ptr<const v1::JobInfo> job, uint64_t min_generation, Absent absent,
                std::function<void(absl::Status, std::vector<std::string>)> done,
                std::shared_ptr<const SeededChunks> seeded = nullptr);
  // Has each of the job's servers load its chunks from the checkpoint
  // `manifest` in job->restored_from() (the files overlapping its chunks),
  // then `done(status)`.
  void Load(std::shared_ptr<const v1::JobInfo> job,
            std::shared_ptr<const internal::CheckpointManifest> manifest,
            std::function<void(absl::Status)> done);
  // Drops `job_id` on `addresses`; `done(servers that failed)` runs when all
  // answered (a server without the job has nothing to drop). With
  // `wait_for_ready` (servers that just registered), each call waits within
  // its timeout for the channel to connect instead of failing at once while
  // the channel to the address's previous process is still backing off.
  void Drop(const std::string& job_id, const std::vector<std::string>& addresses,
            bool wait_for_ready, std::function<void(std::vector<std::string>)> done);
  // Lists the chunks of `job_id` (every job's when empty) on `addresses`;
  // `done(results)` runs when all answered. `wait_for_ready` as for Drop.
  void ListChunks(
      const std::vector<std::string>& addresses, const std::string& job_id, bool wait_for_ready,
      std::function<void(std::vector<std::unique_ptr<FanOutResult<v1::ListChunksResponse>>>&)>
          done);

 private:
  template <typename Request, typename Response>
  using AsyncMethod = void (v1::ShardServer::StubInterface::async_interface::*)(
      grpc::ClientContext*, const Request*, Response*, std::function<void(grpc::Status)>);

  // Calls `method` on each server of `addresses` with the request that
  // `fill(address, &request)` builds; `done(results)` once all answered.
  template <typename Request, typename Response>
  void CallEach(const std::vector<std::string>& addresses, bool wait_for_ready,
                AsyncMethod<Request, Response> method,
                std::function<void(const std::string&, Request*)> fill,
                std::function<void(std::vector<std::unique_ptr<FanOutResult<Response>>>&)> done);

  const absl::Duration call_timeout_;
  const ChannelCredentials credentials_;
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::ShardServer::Stub> stub;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Connection> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_SHARD_FLEET_H_
