#include "coordinator/checkpoint_store.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/chunk_bytes.h"
#include "core/file_io.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/job_spec.h"
#include "strata/internal/records.pb.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "manifest.json";
constexpr char kStepPrefix[] = "step-";
constexpr char kPartialPrefix[] = ".step-";

std::string StepName(int64_t step) { return absl::StrFormat("%s%010d", kStepPrefix, step); }

absl::Status SyncPath(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  absl::Status status = fsync(fd) == 0 ? absl::OkStatus() : ErrnoError("cannot sync", path);
  close(fd);
  return status;
}

absl::Status WriteSynced(const std::string& path, const std::string& contents) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path);
  absl::Status status = WriteFully(fd, contents.data(), contents.size(), path);
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", path);
  close(fd);
  return status;
}

absl::StatusOr<internal::CheckpointManifest> ParseManifest(const std::string& checkpoint) {
  const std::string path = absl::StrCat(checkpoint, "/", kManifest);
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat(checkpoint, " is not a checkpoint: it has no ", kManifest));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  internal::CheckpointManifest manifest;
  auto parsed = google::protobuf::util::JsonStringToMessage(contents.str(), &manifest);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", path, " does not parse: ", parsed.ToString()));
  }
  return manifest;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, const std::string& job_id, int64_t step) {
  return absl::StrCat(dir, "/", job_id, "/", StepName(step));
}

absl::StatusOr<std::string> BeginCheckpoint(const std::string& dir, const std::string& job_id,
                                            int64_t step) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory ", Quoted(dir), " is not an absolute path"));
  }
  const std::string job_dir = absl::StrCat(dir, "/", job_id);
  std::error_code error;
  fs::create_directories(job_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory ", job_dir, ": ", error.message()));
  }
  // Saves of a job run one at a time: any partial directory is a crashed one's.
  for (const auto& entry : fs::directory_iterator(job_dir, error)) {
    if (absl::StartsWith(entry.path().filename().string(), kPartialPrefix)) {
      fs::remove_all(entry.path(), error);
    }
  }
  std::string partial =
      absl::StrCat(job_dir, "/", kPartialPrefix, step, ".partial-", absl::ToUnixNanos(absl::Now()));
  if (!fs::create_directory(partial, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory ", partial, ": ", error.message()));
  }
  return partial;
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& partial,
                                             const internal::CheckpointManifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto printed = google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  RETURN_IF_ERROR(WriteSynced(absl::StrCat(partial, "/", kManifest), json));
  RETURN_IF_ERROR(SyncPath(partial, O_RDONLY | O_DIRECTORY));
  const std::string job_dir = fs::path(partial).parent_path().string();
  const std::string final_path = absl::StrCat(job_dir, "/", StepName(manifest.step()));
  std::error_code error;
  if (fs::exists(final_path, error)) {
    fs::remove_all(partial, error);
    return final_path;
  }
  if (rename(partial.c_str(), final_path.c_str()) != 0) {
    return ErrnoError(absl::StrCat("cannot rename ", partial, " to"), final_path);
  }
  RETURN_IF_ERROR(SyncPath(job_dir, O_RDONLY | O_DIRECTORY));
  return final_path;
}

void AbandonCheckpoint(const std::string& partial) {
  std::error_code ignored;
  fs::remove_all(partial, ignored);
}

absl::StatusOr<internal::CheckpointManifest> ReadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(internal::CheckpointManifest manifest, ParseManifest(path));
  std::vector<const v1::CheckpointFile*> files;
  for (const auto& f : manifest.files()) files.push_back(&f);
  std::sort(files.begin(), files.end(), [](const auto* a, const auto* b) {
    return a->chunk().flat_begin() < b->chunk().flat_begin();
  });
  const StatePrecision precision = StatePrecisionOf(manifest.spec());
  uint64_t next = 0;
  for (const v1::CheckpointFile* f : files) {
    const std::string file = absl::StrCat(path, "/", f->file());
    if (f->file().empty() || absl::StrContains(f->file(), "/") || f->chunk().flat_begin() != next ||
        f->chunk().num_params() == 0 ||
        f->num_bytes() != StateBytes(f->chunk().num_params(), precision)) {
      return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, "/", kManifest,
                                              ": entry for ", file,
                                              " does not fit the flat space at index ", next));
    }
    next += f->chunk().num_params();
    std::error_code error;
    uintmax_t size = fs::file_size(file, error);
    if (error) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file ", file, " is missing: ", error.message()));
    }
    if (size != f->num_bytes()) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", file, " has ", size,
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

absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const std::string& dir,
                                                                const std::string& job_id) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory ", Quoted(dir), " is not an absolute path"));
  }
  const std::string job_dir = absl::StrCat(dir, "/", job_id);
  std::vector<v1::CheckpointInfo> checkpoints;
  std::error_code error;
  if (!fs::is_directory(job_dir, error)) return checkpoints;
  for (const auto& entry : fs::directory_iterator(job_dir, error)) {
    if (!absl::StartsWith(entry.path().filename().string(), kStepPrefix)) continue;
    absl::StatusOr<internal::CheckpointManifest> manifest = ParseManifest(entry.path().string());
    if (!manifest.ok()) continue;  // not ours, or damaged: restore names the problem
    checkpoints.push_back(InfoOf(*manifest, entry.path().string()));
  }
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list checkpoint directory ", job_dir, ": ", error.message()));
  }
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const auto& a, const auto& b) { return a.step() < b.step(); });
  return checkpoints;
}

absl::Status PruneCheckpoints(const std::string& dir, const std::string& job_id, uint32_t keep) {
  if (keep == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto checkpoints, ListCheckpoints(dir, job_id));
  for (size_t i = 0; i + keep < checkpoints.size(); ++i) {
    // Hidden first (atomically), so a crash never leaves half a checkpoint visible.
    const std::string& path = checkpoints[i].path();
    const std::string hidden =
        absl::StrCat(dir, "/", job_id, "/", kPartialPrefix, checkpoints[i].step(), ".pruned");
    if (rename(path.c_str(), hidden.c_str()) != 0) {
      return ErrnoError(absl::StrCat("cannot remove old checkpoint ", path, ": rename to"), hidden);
    }
    std::error_code ignored;
    fs::remove_all(hidden, ignored);
  }
  return absl::OkStatus();
}

}  // namespace strata
