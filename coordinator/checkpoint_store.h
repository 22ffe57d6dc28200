// The checkpoints of jobs on a file system, as the coordinator sees them:
//
//   DIR/JOB/step-0000000010/chunk-00000000.bin ...   (server/saved_chunk.h)
//   DIR/JOB/step-0000000010/manifest.json            (internal::CheckpointManifest)
//
// A save writes into a hidden directory DIR/JOB/.step-N.partial-T, writes
// the manifest last, syncs, and renames the directory into place: a crash at
// any moment leaves the earlier checkpoints intact and the partial one
// invisible (the next save of the job removes it). Stateless functions;
// saves of one job must not run at once.
#ifndef STRATA_COORDINATOR_CHECKPOINT_STORE_H_
#define STRATA_COORDINATOR_CHECKPOINT_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/path_root.h"
#include "strata/internal/records.pb.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

// The directory of `job_id`'s checkpoint of `step` under `dir`: DIR/JOB/step-NNNNNNNNNN.
std::string CheckpointPath(const std::string& dir, const std::string& job_id, int64_t step);

// Every function below takes directories Resolve()d inside `root` and
// reaches them from the root's directory without following a symlink
// (PathRoot::OpenDirBeneath), then works inside them by descriptor
// (core/dir_fd.h): a symlink or rename made inside the root meanwhile
// leads nowhere else. INVALID_ARGUMENT for a directory not inside `root`.

// A fresh partial directory for a save of `job_id`'s `step` under `dir`
// (made when missing), after removing partial ones of crashed saves of the
// job. FAILED_PRECONDITION or the I/O error naming the directory.
absl::StatusOr<std::string> BeginCheckpoint(const PathRoot& root, const std::string& dir,
                                            const std::string& job_id, int64_t step);
// Writes `manifest` into `partial` (synced) and renames it to its final
// name; returns that path. When a checkpoint of the step exists already,
// `partial` is removed and the existing one's path returned.
absl::StatusOr<std::string> CommitCheckpoint(const PathRoot& root, const std::string& partial,
                                             const internal::CheckpointManifest& manifest);
// Removes a partial directory of a failed save.
void AbandonCheckpoint(const PathRoot& root, const std::string& partial);

// The manifest of the checkpoint at `path`, checked: FAILED_PRECONDITION
// when `path` is not a directory with a manifest.json (not a checkpoint);
// DATA_LOSS naming the file when the manifest does not parse or exceeds
// kMaxManifestBytes, its files do not tile the flat space, or a file is
// missing, not a regular file, or has another size.
absl::StatusOr<internal::CheckpointManifest> ReadCheckpoint(const PathRoot& root,
                                                            const std::string& path);
// The most bytes a manifest may have: 2^20 chunks' entries (~200 bytes each).
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

// The complete checkpoints of `job_id` under `dir`, oldest first (by step).
absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const PathRoot& root,
                                                                const std::string& dir,
                                                                const std::string& job_id);
// Removes all but the newest `keep` complete checkpoints of the job.
absl::Status PruneCheckpoints(const PathRoot& root, const std::string& dir,
                              const std::string& job_id, uint32_t keep);

v1::CheckpointInfo InfoOf(const internal::CheckpointManifest& manifest, const std::string& path);

}  // namespace strata

#endif  // STRATA_COORDINATOR_CHECKPOINT_STORE_H_
