#include "tools/bench/fio.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/round_up.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

// The arguments of a job that runs for 4 s, over and over the file.
constexpr char kFourSeconds[] = "--runtime=4 --time_based";

// fio's buffers and file registered with its ring: without, each I/O pins
// its buffer's pages on fio's one thread, which then reads at half the rate
// it reaches registered (1.2-1.3 GB/s against 2.1-2.5 on the 2-vCPU VM) and
// below what the NVMe tier reads there (1.7-2.0 GB/s): a bound on fio's
// thread, not on the disk.
constexpr char kRegistered[] = "--fixedbufs --registerfiles";

// fio's buffers in transparent huge pages (glibc's malloc advises
// MADV_HUGEPAGE for the mapping), as the tiers' memory is. In 4 KiB pages a
// 1 MiB buffer has 256 segments, past a virtio disk's limit (254 on the
// 2-vCPU VM), and the block layer splits each I/O in two: fio then moved
// 1.7 GB/s reading and writing at once, the NVMe tier 3.3 (its 1 MiB
// requests whole and merged), and fio's huge-page run 4.0. A bound on fio's
// memory, not on the disk.
constexpr char kHugePageBuffers[] = "GLIBC_TUNABLES=glibc.malloc.hugetlb=1";

// The name of fio's file in a bench's directory; a run over several files
// adds ".<job>" to it.
constexpr char kFileName[] = "strata-fio.data";

// fio's JSON reports of `files` jobs at once, each on a file of
// `file_bytes` in `dir` (dir/strata-fio.data for one, else
// dir/strata-fio.data.<job>), with `args` added.
absl::StatusOr<nlohmann::json> RunFioJobs(const std::string& dir, uint64_t file_bytes,
                                          uint64_t io_bytes, unsigned queue_depth, unsigned files,
                                          const std::string& args) {
  const std::string names =
      files == 1
          ? absl::StrCat("--filename=", kFileName)
          : absl::StrCat("--numjobs=", files, " --filename_format=", kFileName, ".\\$jobnum");
  std::string command = absl::StrCat(kHugePageBuffers, " fio --name=strata --directory=", dir, " ",
                                     names, " --size=", file_bytes, " --bs=", io_bytes,
                                     " --iodepth=", queue_depth, " --ioengine=io_uring --direct=1 ",
                                     kRegistered, " ", args, " --output-format=json 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::FailedPreconditionError("cannot run fio");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  if (pclose(pipe) != 0) {
    return absl::FailedPreconditionError(
        "fio failed or is not installed (deploy/install-deps.sh installs it)");
  }
  nlohmann::json result = nlohmann::json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.contains("jobs")) {
    return absl::InternalError("fio printed no JSON");
  }
  if (result["jobs"].size() != files) {
    return absl::InternalError(
        absl::StrCat("fio reported ", result["jobs"].size(), " jobs, not ", files));
  }
  return result["jobs"];
}

// fio's JSON report of one job on dir/strata-fio.data with `args` added.
absl::StatusOr<nlohmann::json> RunFio(const std::string& dir, uint64_t file_bytes,
                                      uint64_t io_bytes, unsigned queue_depth,
                                      const std::string& args) {
  absl::StatusOr<nlohmann::json> jobs = RunFioJobs(dir, file_bytes, io_bytes, queue_depth, 1, args);
  if (!jobs.ok()) return jobs.status();
  return (*jobs)[0];
}

}  // namespace

absl::StatusOr<double> Fio(const std::string& dir, const std::string& rw, uint64_t file_bytes,
                           uint64_t io_bytes, unsigned queue_depth) {
  absl::StatusOr<nlohmann::json> job =
      RunFio(dir, file_bytes, io_bytes, queue_depth, absl::StrCat("--rw=", rw, " ", kFourSeconds));
  if (!job.ok()) return job.status();
  return (*job)[rw]["bw_bytes"].get<double>() / 1e9;
}

absl::StatusOr<double> FioOnce(const std::string& dir, const std::string& rw, uint64_t bytes,
                               uint64_t io_bytes, unsigned queue_depth, unsigned files) {
  if (files == 0) return absl::InvalidArgumentError("fio needs at least one file");
  const uint64_t file_bytes = RoundUp((bytes + files - 1) / files, io_bytes);
  // A write counts until its data is on the disk (fsync at the end).
  absl::StatusOr<nlohmann::json> jobs =
      RunFioJobs(dir, file_bytes, io_bytes, std::max(1u, queue_depth / files), files,
                 absl::StrCat("--rw=", rw, rw == "write" ? " --end_fsync=1 --fallocate=none" : ""));
  if (!jobs.ok()) return jobs.status();
  // The bytes of every job over the longest job's whole run (bw_bytes
  // leaves out the final fsync); the jobs' bw_bytes summed where the run
  // was too short for fio to time.
  double moved_bytes = 0, seconds = 0, bandwidth_bytes = 0;
  for (const nlohmann::json& job : *jobs) {
    moved_bytes += job[rw]["io_bytes"].get<double>();
    bandwidth_bytes += job[rw]["bw_bytes"].get<double>();
    seconds = std::max(seconds, job["job_runtime"].get<double>() / 1e3);
  }
  if (seconds <= 0) return bandwidth_bytes / 1e9;
  return moved_bytes / seconds / 1e9;
}

void RemoveFioFiles(const std::string& dir) {
  std::error_code error;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == kFileName || absl::StartsWith(name, absl::StrCat(kFileName, "."))) {
      files.push_back(entry.path());
    }
  }
  for (const std::filesystem::path& file : files) std::filesystem::remove(file, error);
}

absl::StatusOr<FioMixed> FioReadWrite(const std::string& dir, uint64_t file_bytes,
                                      uint64_t io_bytes, unsigned queue_depth) {
  absl::StatusOr<nlohmann::json> job =
      RunFio(dir, file_bytes, io_bytes, queue_depth,
             absl::StrCat("--rw=rw --rwmixread=50 --sync=dsync ", kFourSeconds));
  if (!job.ok()) return job.status();
  return FioMixed{(*job)["read"]["bw_bytes"].get<double>() / 1e9,
                  (*job)["write"]["bw_bytes"].get<double>() / 1e9};
}

}  // namespace strata
