#include "coordinator/checkpoint_store.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/chunk_bytes.h"
#include "core/dir_fd.h"
#include "core/file_io.h"
#include "core/status_macros.h"
#include "rpc/job_spec.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

constexpr char kManifest[] = "manifest.json";
constexpr char kStepPrefix[] = "step-";
constexpr char kPartialPrefix[] = ".step-";

std::string StepName(int64_t step) { return absl::StrFormat("%s%010d", kStepPrefix, step); }

// The directory that holds `path` and the name of `path` in it.
std::pair<std::string, std::string> SplitLast(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {"", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

absl::Status WriteSynced(const DirFd& dir, const std::string& name, const std::string& contents) {
  const std::string path = dir.PathOf(name);
  const int fd = dir.OpenFile(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path);
  absl::Status status = WriteFully(fd, contents.data(), contents.size(), path);
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  return status;
}

// Whether `name` in `dir` exists (a symlink counts; nothing is followed).
bool Exists(const DirFd& dir, const std::string& name) {
  struct stat st;
  return fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

absl::StatusOr<internal::CheckpointManifest> ParseManifest(const DirFd& checkpoint) {
  const std::string path = checkpoint.PathOf(kManifest);
  const int fd = checkpoint.OpenFile(kManifest, O_RDONLY);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(checkpoint.path(),
                                                      " is not a checkpoint: it has no ", kManifest,
                                                      " (", std::strerror(errno), ")"));
  }
  struct stat st;
  std::string contents;
  absl::Status read;
  if (fstat(fd, &st) != 0) {
    read = ErrnoError("cannot stat", path);
  } else if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    read = absl::DataLossError(absl::StrCat(
        "checkpoint manifest ", path, " is not a file of at most ", kMaxManifestBytes, " bytes"));
  } else {
    contents.resize(st.st_size);
    read = ReadFully(fd, contents.data(), contents.size(), path);
  }
  close(fd);
  RETURN_IF_ERROR(read);
  internal::CheckpointManifest manifest;
  auto parsed = google::protobuf::util::JsonStringToMessage(contents, &manifest);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, " does not parse: ", parsed.ToString()));
  }
  return manifest;
}

// The directory of `job_id`'s checkpoints under `dir`: nullopt when `dir`
// or it is missing.
absl::StatusOr<std::optional<DirFd>> OpenJobDir(const PathRoot& root, const std::string& dir,
                                                const std::string& job_id) {
  absl::StatusOr<DirFd> top = root.OpenDirBeneath(dir, /*create=*/false);
  if (absl::IsInvalidArgument(top.status())) return top.status();
  if (!top.ok()) return std::nullopt;
  absl::StatusOr<DirFd> job = top->Sub(job_id);
  if (!job.ok()) return std::nullopt;
  return std::optional<DirFd>(*std::move(job));
}

// The complete checkpoints in the job directory `job`, oldest first.
absl::StatusOr<std::vector<v1::CheckpointInfo>> ListIn(const DirFd& job) {
  ASSIGN_OR_RETURN(const std::vector<std::string> names, job.List());
  std::vector<v1::CheckpointInfo> checkpoints;
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, kStepPrefix)) continue;
    absl::StatusOr<DirFd> checkpoint = job.Sub(name);
    if (!checkpoint.ok()) continue;  // not ours
    absl::StatusOr<internal::CheckpointManifest> manifest = ParseManifest(*checkpoint);
    if (!manifest.ok()) continue;  // not ours, or damaged: restore names the problem
    checkpoints.push_back(InfoOf(*manifest, checkpoint->path()));
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const auto& a, const auto& b) { return a.step() < b.step(); });
  return checkpoints;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, const std::string& job_id, int64_t step) {
  return absl::StrCat(dir, "/", job_id, "/", StepName(step));
}

absl::StatusOr<std::string> BeginCheckpoint(const PathRoot& root, const std::string& dir,
                                            const std::string& job_id, int64_t step) {
  ASSIGN_OR_RETURN(const DirFd top, root.OpenDirBeneath(dir, /*create=*/true));
  ASSIGN_OR_RETURN(const DirFd job, top.Sub(job_id, /*create=*/true));
  // Saves of a job run one at a time: any partial directory is a crashed one's.
  ASSIGN_OR_RETURN(const std::vector<std::string> names, job.List());
  for (const std::string& name : names) {
    if (absl::StartsWith(name, kPartialPrefix)) RETURN_IF_ERROR(job.RemoveTree(name));
  }
  const std::string partial =
      absl::StrCat(kPartialPrefix, step, ".partial-", absl::ToUnixNanos(absl::Now()));
  if (mkdirat(job.fd(), partial.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create checkpoint directory ", job.PathOf(partial), ": ", std::strerror(errno)));
  }
  return job.PathOf(partial);
}

absl::StatusOr<std::string> CommitCheckpoint(const PathRoot& root, const std::string& partial,
                                             const internal::CheckpointManifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto printed = google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  const auto [job_path, partial_name] = SplitLast(partial);
  ASSIGN_OR_RETURN(const DirFd job, root.OpenDirBeneath(job_path, /*create=*/false));
  {
    ASSIGN_OR_RETURN(const DirFd written, job.Sub(partial_name));
    RETURN_IF_ERROR(WriteSynced(written, kManifest, json));
    RETURN_IF_ERROR(written.Sync());
  }
  const std::string final_name = StepName(manifest.step());
  if (Exists(job, final_name)) {
    (void)job.RemoveTree(partial_name);
    return job.PathOf(final_name);
  }
  RETURN_IF_ERROR(job.Rename(partial_name, final_name));
  RETURN_IF_ERROR(job.Sync());
  return job.PathOf(final_name);
}

void AbandonCheckpoint(const PathRoot& root, const std::string& partial) {
  const auto [job_path, partial_name] = SplitLast(partial);
  absl::StatusOr<DirFd> job = root.OpenDirBeneath(job_path, /*create=*/false);
  if (job.ok()) (void)job->RemoveTree(partial_name);
}

absl::StatusOr<internal::CheckpointManifest> ReadCheckpoint(const PathRoot& root,
                                                            const std::string& path) {
  absl::StatusOr<DirFd> checkpoint = root.OpenDirBeneath(path, /*create=*/false);
  if (!checkpoint.ok()) {
    if (absl::IsInvalidArgument(checkpoint.status())) return checkpoint.status();
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a checkpoint: ", checkpoint.status().message()));
  }
  ASSIGN_OR_RETURN(internal::CheckpointManifest manifest, ParseManifest(*checkpoint));
  std::vector<const v1::CheckpointFile*> files;
  for (const auto& f : manifest.files()) files.push_back(&f);
  std::sort(files.begin(), files.end(), [](const auto* a, const auto* b) {
    return a->chunk().flat_begin() < b->chunk().flat_begin();
  });
  const StatePrecision precision = StatePrecisionOf(manifest.spec());
  uint64_t next = 0;
  for (const v1::CheckpointFile* f : files) {
    const std::string file = checkpoint->PathOf(f->file());
    if (!IsPlainFileName(f->file()) || f->chunk().flat_begin() != next ||
        f->chunk().num_params() == 0 ||
        f->num_bytes() != StateBytes(f->chunk().num_params(), precision)) {
      return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, "/", kManifest,
                                              ": entry for ", file,
                                              " does not fit the flat space at index ", next));
    }
    next += f->chunk().num_params();
    struct stat st;
    if (fstatat(checkpoint->fd(), f->file().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", file, " is missing: ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", file, " is not a regular file"));
    }
    if (static_cast<uint64_t>(st.st_size) != f->num_bytes()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", file, " has ", st.st_size,
                                              " bytes; the manifest says ", f->num_bytes()));
    }
  }
  if (next != manifest.flat_num_params()) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, "/", kManifest,
                                            ": its files cover ", next, " of ",
                                            manifest.flat_num_params(), " parameters"));
  }
  return manifest;
}

v1::CheckpointInfo InfoOf(const internal::CheckpointManifest& manifest, const std::string& path) {
  v1::CheckpointInfo info;
  info.set_job_id(manifest.spec().job_id());
  info.set_step(manifest.step());
  info.set_path(path);
  for (const auto& f : manifest.files()) info.set_num_bytes(info.num_bytes() + f.num_bytes());
  info.set_num_files(manifest.files_size());
  info.set_created_unix_ms(manifest.created_unix_ms());
  info.set_save_seconds(manifest.save_seconds());
  info.set_write_seconds(manifest.write_seconds());
  return info;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const PathRoot& root,
                                                                const std::string& dir,
                                                                const std::string& job_id) {
  ASSIGN_OR_RETURN(const std::optional<DirFd> job, OpenJobDir(root, dir, job_id));
  if (!job.has_value()) return std::vector<v1::CheckpointInfo>();
  return ListIn(*job);
}

absl::Status PruneCheckpoints(const PathRoot& root, const std::string& dir,
                              const std::string& job_id, uint32_t keep) {
  if (keep == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::optional<DirFd> job, OpenJobDir(root, dir, job_id));
  if (!job.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<v1::CheckpointInfo> checkpoints, ListIn(*job));
  for (size_t i = 0; i + keep < checkpoints.size(); ++i) {
    // Hidden first (atomically), so a crash never leaves half a checkpoint visible.
    const std::string hidden = absl::StrCat(kPartialPrefix, checkpoints[i].step(), ".pruned");
    RETURN_IF_ERROR(job->Rename(StepName(checkpoints[i].step()), hidden));
    (void)job->RemoveTree(hidden);
  }
  return absl::OkStatus();
}

}  // namespace strata
