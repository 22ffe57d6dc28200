// Membership: the workers of every job, their leases, and the job's
// generations. A worker joins and renews its lease by heartbeats; a join, a
// graceful leave or an expired lease opens a new generation (the members in
// join order; a worker's rank is its index). The first generation of a job
// forms once its spec's world_size workers have joined; after that every
// change opens one, even to zero members. Generations and members are
// written to RocksDB before a change is answered; after a restart every
// member gets a fresh lease. A member whose generation stream breaks and
// that opens none again within kReconnectGrace (its process died) is
// dropped then, as if its lease ran out. A lease runs out only while the
// coordinator hears from some peer (Reachability) after the member's last
// sign of life: cut off from everyone, it expires none, and once it hears
// again every member has as long as the silence lasted, plus a lease, to
// renew. Watchers hear of each new generation.
//
// Thread-safe. A background thread expires leases; Watcher callbacks run
// under the membership's lock and must not call back into it.
#ifndef STRATA_COORDINATOR_MEMBERSHIP_H_
#define STRATA_COORDINATOR_MEMBERSHIP_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/reachability.h"
#include "storage/metadata_store.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

class Membership {
 public:
  class Watcher {
   public:
    virtual ~Watcher() = default;
    virtual void OnGeneration(const v1::Generation& generation) = 0;
    // The coordinator is stopping: no more generations will come.
    virtual void OnStop() = 0;
  };

  // Loads members and generations from `metadata` and starts the lease
  // thread. Hearing from a worker counts in `reachability`, which outlives
  // the membership.
  static absl::StatusOr<std::unique_ptr<Membership>> Create(MetadataStore* metadata,
                                                            absl::Duration lease,
                                                            Reachability* reachability);
  // Stops expiring leases (a stopping coordinator must not drop members that
  // cannot reach it) and tells the watchers. Also run by the destructor.
  void Stop();
  ~Membership();

  absl::Duration lease() const { return lease_; }

  // Runs `f(job_id)` each time a member of a formed generation is dropped
  // for a lost lease or a closed stream (a step it ran may have been cut
  // short), under the membership's lock: `f` must not call back into it.
  void SetOnMemberLost(std::function<void(const std::string& job_id)> f);

  // Adds (or renews) worker request.worker_id() in job `spec`. INVALID_ARGUMENT
  // for a bad worker id; RESOURCE_EXHAUSTED past the maximum world size.
  absl::StatusOr<v1::JoinJobResponse> Join(const v1::JobSpec& spec,
                                           const v1::JoinJobRequest& request);
  // Renews a lease; returns the current generation number. FAILED_PRECONDITION
  // when the worker is not a member.
  absl::StatusOr<uint64_t> Heartbeat(const v1::HeartbeatRequest& request);
  // Removes a member; returns the generation without it. FAILED_PRECONDITION
  // when the worker is not a member.
  absl::StatusOr<v1::Generation> Leave(const v1::LeaveJobRequest& request);
  // A member could not form request.generation(): when it is still the
  // newest, opens the next with the same members. Returns the newest.
  // FAILED_PRECONDITION when the worker is not a member, INVALID_ARGUMENT
  // for a reason over 1 KiB.
  absl::StatusOr<v1::Generation> Renew(const v1::RenewGenerationRequest& request);
  // How long a member whose generation stream broke has to open another (a
  // live worker re-watches within 100 ms) before it stops being a member.
  static constexpr absl::Duration kReconnectGrace = absl::Milliseconds(300);
  // Member `worker_id` opened a generation stream at `opened` (it is alive:
  // a heartbeat).
  void Watching(const std::string& job_id, const std::string& worker_id, absl::Time opened);
  // The generation stream member `worker_id` opened at `opened` was cancelled
  // by its client (the process died, or its connection did): unless it has
  // opened a newer one, joined again since, or the membership is stopping,
  // its lease ends kReconnectGrace from now (a heartbeat or a new stream
  // renews it). Not while cut off from everyone: the lease decides then.
  void Disconnected(const std::string& job_id, const std::string& worker_id, absl::Time opened);

  // The job's chunks moved (JobInfo.placement_version is now `version`) and
  // it resumes from `step`: opens a generation of the same members that
  // carries the version, so that they follow it (unless the current one
  // carries it already). `at_step_boundary` says so in the generation: the
  // step under way goes on (AwaitStepBoundary()); without it, a current
  // generation that said so is followed by one that does not, which cuts
  // the step. Returns the number of that generation (of the first, when
  // none has formed yet).
  absl::StatusOr<uint64_t> ChunksMoved(const std::string& job_id, uint64_t version, int64_t step,
                                       bool at_step_boundary = false);
  // Waits, for at most a lease, until every member of generation `number`
  // of `job_id` (opened by ChunksMoved at a step boundary) said it stopped
  // for it (HeartbeatRequest.stopped_for): true then, or when it has no
  // member. False at the deadline, once `number` is not the job's current
  // generation (a member came or went: that generation cuts the step under
  // way), or once EndStepBoundaryWaits() is called.
  bool AwaitStepBoundary(const std::string& job_id, uint64_t number);
  // Ends every AwaitStepBoundary() under way (false): a shard server was
  // lost, and workers whose step used it reach no boundary.
  void EndStepBoundaryWaits();

  // Forgets a deleted job: its generations (and watchers, which hear no
  // more). FAILED_PRECONDITION, naming them, while it has members.
  absl::Status Forget(const std::string& job_id);

  // The placement version the job's newest generation carries (0: none).
  uint64_t PlacementVersion(const std::string& job_id) const;

  void ListMembers(const std::string& job_id, v1::ListMembersResponse* response) const;
  void Summarize(const std::string& job_id, v1::JobSummary* summary) const;

  // Registers `watcher` for the job's generations and returns the current one.
  v1::Generation Subscribe(const std::string& job_id, Watcher* watcher);
  void Unsubscribe(const std::string& job_id, Watcher* watcher);

 private:
  struct Member {
    v1::Member info;
    absl::Time lease_expiry;
    int64_t first_step = -1;                           // completed_step at its first heartbeat
    absl::Time watching_since = absl::InfinitePast();  // its newest stream opened
    bool disconnected = false;                         // its lease was cut short by Disconnected()
    uint64_t stopped_for = 0;                          // HeartbeatRequest.stopped_for, the newest
  };
  struct Job {
    uint32_t initial_world_size = 1;
    v1::Generation generation;
    uint64_t placement_version = 0;  // the next generation's
    uint64_t moved_in = 0;           // the generation that carried it
    std::vector<Member> members;     // join order
    int64_t committed_step = 0;
    std::vector<Watcher*> watchers;
  };

  Membership(MetadataStore* metadata, absl::Duration lease, Reachability* reachability);
  absl::Status Load();
  void ExpireLeasesLoop();
  // A peer was heard from after an isolation: renews every lease for the
  // members to come back.
  void EndIsolation(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member `worker_id` of `job_id`; nullptr when it is none.
  Member* FindMember(const std::string& job_id, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists a member record.
  absl::Status PutMember(const std::string& job_id, const Member& member)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the next generation of `job` from its members (or, before the
  // first, once enough have joined), persists it and tells the watchers.
  absl::Status MaybeOpenGeneration(const std::string& job_id, Job* job, bool changed,
                                   bool at_step_boundary = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RemoveMember(const std::string& job_id, Job* job, const std::string& worker_id,
                            const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetadataStore* const metadata_;
  const absl::Duration lease_;
  Reachability* const reachability_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lease_cut_ ABSL_GUARDED_BY(mu_) = false;             // wakes the lease thread
  uint64_t boundary_waits_ended_ ABSL_GUARDED_BY(mu_) = 0;  // EndStepBoundaryWaits() calls
  // Since when an expired lease waits for a sign of the network.
  bool isolated_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time isolated_since_ ABSL_GUARDED_BY(mu_);
  std::thread lease_thread_;
  std::function<void(const std::string&)> on_member_lost_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_MEMBERSHIP_H_
