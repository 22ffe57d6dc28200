// WorkerMembership: one worker's membership of a job at the coordinator. It
// joins, keeps the lease alive with heartbeats from a background thread
// (joining again if the lease was lost), and follows the job's generations
// through the WatchGeneration stream on a second thread.
//
// Thread-safe. `on_interrupted(running, members_changed)` runs on the watch
// thread when a generation arrives that lacks a member of generation
// `running`, the one this worker runs in (set by Running()), or that moved
// the job's chunks (a newer placement version) other than at a step
// boundary (Generation.at_step_boundary): the running step cannot
// complete, so its in-flight RPCs should be cancelled, and where a member is
// missing (`members_changed`) its collectives too. Running() calls it on the
// caller's thread when such a generation came while `running` formed. It
// must not block. A move at a step boundary waits until every member said
// it stopped for it: each worker says so for every such generation it hears
// while it has no step's pushes or pulls in flight (SetStepInFlight()), at
// once in a heartbeat (stopped_for).
#ifndef STRATA_CLIENT_WORKER_MEMBERSHIP_H_
#define STRATA_CLIENT_WORKER_MEMBERSHIP_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "strata/v1/coordinator.grpc.pb.h"

#include "rpc/tls.h"

namespace strata {

class WorkerMembership {
 public:
  // Joins `job_id` as `worker_id` and starts the heartbeat and watch threads.
  static absl::StatusOr<std::unique_ptr<WorkerMembership>> Join(
      const std::string& coordinator_address, const ChannelCredentials& credentials,
      const std::string& job_id, const std::string& worker_id,
      std::function<void(uint64_t, bool)> on_interrupted);
  // Stops the threads (without leaving: the lease then runs out).
  ~WorkerMembership();

  const std::string& worker_id() const { return worker_id_; }
  absl::Duration lease() const { return lease_; }
  // The newest generation heard of.
  v1::Generation Latest() const;
  // Waits until a generation newer than `than` that includes this worker
  // has formed. DEADLINE_EXCEEDED naming the generation seen last.
  absl::StatusOr<v1::Generation> WaitNewer(uint64_t than, absl::Time deadline) const;
  // Records the generation this worker runs in and its last completed step
  // (reported by heartbeats). Where a generation observed already ends
  // `generation`, calls on_interrupted(generation.number()) before returning.
  void Running(const v1::Generation& generation, int64_t completed_step);
  // Whether a step's pushes or pulls are in flight: a generation at a step
  // boundary heard while none are, or once they end, is stopped for -- the
  // servers may be fenced against older generations: pushes that follow in
  // one are cut (ABORTED), as a move cuts them without the boundary.
  void SetStepInFlight(bool in_flight);
  // A graceful leave: returns the generation without this worker, and stops
  // heartbeats. FAILED_PRECONDITION when it was no longer a member.
  absl::StatusOr<v1::Generation> Leave();
  // This worker could not form its group in generation `number` for
  // `reason`: asks the coordinator to open the next one with the same
  // members, unless a newer one exists already.
  absl::Status Renew(uint64_t number, absl::string_view reason);

 private:
  WorkerMembership(const std::string& coordinator_address, const ChannelCredentials& credentials,
                   std::string job_id, std::string worker_id,
                   std::function<void(uint64_t, bool)> on_interrupted);
  absl::Status SendJoin();
  void Observe(const v1::Generation& generation);
  void HeartbeatLoop();
  void WatchLoop();

  const std::string job_id_;
  const std::string worker_id_;
  const std::function<void(uint64_t, bool)> on_interrupted_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Duration lease_ = absl::Seconds(3);

  mutable absl::Mutex mu_;
  v1::Generation latest_ ABSL_GUARDED_BY(mu_);
  v1::Generation running_ ABSL_GUARDED_BY(mu_);
  // The newest generations observed, oldest first.
  std::deque<v1::Generation> recent_ ABSL_GUARDED_BY(mu_);
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t stopped_for_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stopped_for_sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread heartbeat_thread_, watch_thread_;
};

}  // namespace strata

#endif  // STRATA_CLIENT_WORKER_MEMBERSHIP_H_
