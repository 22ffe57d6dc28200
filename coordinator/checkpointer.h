// Checkpointer: the coordinator's side of checkpoints. Save() has every
// shard server of a job write its chunks at one step (ShardServer.SaveChunks,
// which does not stop training), then commits the manifest
// (server/checkpoint_store.h) and prunes old checkpoints. Jobs with
// checkpoint_every_steps get a thread that saves steps N, 2N, ... as
// training reaches them (counting again from the restored step when the
// job's chunks move; a multiple the job passes while the previous save
// writes is skipped, and logged). One save per job at a time. A replicated
// job's other copies checksum their state at the step (nothing written):
// one that differs from its primary's file is DATA_LOSS, logged and
// reported (OnDivergent). A server holding only replicas that does not
// answer leaves them uncompared (logged); the checkpoint stands.
//
// Thread-safe. Stop() ends the periodic threads and cancels server calls in
// flight; Save() then fails with CANCELLED, as do a job's saves that
// CancelSaves() cancels.
#ifndef STRATA_COORDINATOR_CHECKPOINTER_H_
#define STRATA_COORDINATOR_CHECKPOINTER_H_

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/path_root.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/coordinator.pb.h"
#include "strata/v1/shard.grpc.pb.h"

namespace strata {

class Checkpointer {
 public:
  using StubFor = std::function<v1::ShardServer::Stub*(const std::string& address)>;
  // The job's current JobInfo (NOT_FOUND when there is none).
  using JobFor = std::function<absl::StatusOr<v1::JobInfo>(const std::string& job_id)>;
  // Told of a chunk's copy (not the primary) whose state at a checkpoint's
  // step differs from its primary's (job id, chunk id, server address).
  using OnDivergent =
      std::function<void(const std::string& job_id, uint32_t chunk_id, const std::string& address)>;
  // `default_dir`: where jobs without a checkpoint_dir save (inside `root`).
  Checkpointer(StubFor stub_for, JobFor job_for, OnDivergent on_divergent, PathRoot root,
               std::string default_dir);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // The directory of a job's checkpoints: `dir` if given, else the spec's
  // checkpoint_dir, else the default, resolved inside the checkpoint root
  // (INVALID_ARGUMENT naming the field otherwise).
  absl::StatusOr<std::string> DirFor(const v1::JobSpec& spec, const std::string& dir) const;
  const PathRoot& root() const { return root_; }
  // Saves `job` at `step` into `dir`; step -1: the newest step any chunk has
  // applied (chosen again if a chunk passes it first). Waits up to `wait` for
  // chunks below the step. FAILED_PRECONDITION while another save of the job
  // runs; a server's error naming it; nothing visible is left by a failure.
  absl::StatusOr<v1::CheckpointInfo> Save(const v1::JobInfo& job, const std::string& dir,
                                          int64_t step = -1,
                                          absl::Duration wait = absl::Seconds(60));
  // Saves `job` every checkpoint_every_steps steps (no-op when 0), after
  // the newest checkpoint in its directory and its restored step.
  void StartPeriodic(const v1::JobInfo& job);
  // Cancels the job's saves in flight (its chunks are moving).
  void CancelSaves(const std::string& job_id);
  void Stop();

 private:
  // The newest step any chunk of `job` has applied (ShardServer.ListChunks).
  absl::StatusOr<int64_t> NewestAppliedStep(const v1::JobInfo& job);
  absl::StatusOr<v1::CheckpointInfo> SaveAt(const v1::JobInfo& job, const std::string& dir,
                                            int64_t step, absl::Duration wait);
  // Compares the checksum of each replica of `job` at `step` (chunk id ->
  // server, checksum) with its primary's file in `manifest`: a mismatch is
  // DATA_LOSS, logged, and reported to on_divergent_.
  void CompareReplicas(
      const v1::JobInfo& job, int64_t step, const internal::CheckpointManifest& manifest,
      const std::multimap<uint32_t, std::pair<std::string, uint64_t>>& replica_checksums);
  void RunPeriodic(const std::string& job_id);
  // Calls in flight for a job, so that they can be cancelled; false when stopping.
  bool Track(grpc::ClientContext* context, const std::string& job_id);
  void Untrack(grpc::ClientContext* context);

  const StubFor stub_for_;
  const JobFor job_for_;
  const OnDivergent on_divergent_;
  const PathRoot root_;
  const std::string default_dir_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> saving_ ABSL_GUARDED_BY(mu_);  // job ids
  absl::flat_hash_map<grpc::ClientContext*, std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> periodic_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_COORDINATOR_CHECKPOINTER_H_
