#include "tools/bench/checkpoint_bench.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/chunk_bytes.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "shard/chunk.h"
#include "shard/saved_chunk.h"
#include "shard/state_arena.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/local_cluster.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/fio.h"

namespace strata {
namespace {

using nlohmann::json;

constexpr uint64_t kChunkParams = uint64_t{4} << 20;

// One worker stepping in a loop; every step's [start, end) is recorded.
class Trainer {
 public:
  explicit Trainer(Client* client, uint64_t num_params)
      : client_(client), grads_(num_params, 1e-3f), thread_([this] { Loop(); }) {}
  ~Trainer() { Join(); }

  // Ends the loop; returns the first step's error, if any.
  absl::Status Stop() {
    Join();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // Waits until `n` steps have run; the error that ended the loop first, if any.
  absl::Status WaitSteps(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return steps_.size() >= n || !status_.ok();
    };
    mu_.Await(absl::Condition(&enough));
    return status_;
  }
  std::vector<std::pair<absl::Time, absl::Time>> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  void Loop() {
    while (!stop_) {
      absl::Time started = absl::Now();
      absl::Status s = client_->AccumulateGradients(grads_);
      if (s.ok()) s = client_->Step().status();
      absl::MutexLock lock(&mu_);
      if (!s.ok()) {
        status_ = s;
        return;
      }
      steps_.push_back({started, absl::Now()});
    }
  }

  void Join() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  Client* const client_;
  const std::vector<float> grads_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<absl::Time, absl::Time>> steps_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Waits until every server of `cluster` holds the checkpoint memory its
// jobs' saves reserve (or all its limit allows), which servers fault in off
// the training's path after a job is allocated: steps timed meanwhile would
// share the cores with it and make the pause baseline too long. Returns the
// seconds waited; DEADLINE_EXCEEDED after a minute.
absl::StatusOr<double> WaitForFaultIn(const LocalCluster& cluster) {
  const absl::Time started = absl::Now();
  auto faulted_in = [&] {
    for (const auto& server : cluster.servers()) {
      const StateArena& arena = server->checkpoint_arena();
      if (arena.held_bytes() < std::min(arena.reserved_bytes(), arena.limit_bytes())) {
        return false;
      }
    }
    return true;
  };
  while (!faulted_in()) {
    if (absl::Now() - started > absl::Minutes(1)) {
      return absl::DeadlineExceededError(
          "the shard servers' checkpoint memory was not faulted in within a minute");
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::ToDoubleSeconds(absl::Now() - started);
}

// A save while the trainer steps: its window, what the coordinator
// answered, and the time the steps it overlapped took beyond the median.
struct Save {
  absl::Time started, ended;
  v1::CheckpointInfo info;
  double pause_s = 0;
  int steps_during_save = 0;
  double save_s() const { return absl::ToDoubleSeconds(ended - started); }
};

// The two saves of a training job and what they cost it.
struct SavesWhileTraining {
  double step_s = 0;  // the median step before the saves
  // The first save, and a second two steps later.
  Save saves[2];
  // By the server that allocated most: checkpoint memory faulted in by the
  // saves themselves rather than when the job was allocated.
  uint64_t allocated_during_saves = 0;
};

// Each server's checkpoint memory allocated beyond what it keeps.
std::vector<uint64_t> AllocatedBeyond(const LocalCluster& cluster) {
  std::vector<uint64_t> bytes;
  for (const auto& server : cluster.servers()) {
    bytes.push_back(server->checkpoint_arena().allocated_beyond_bytes());
  }
  return bytes;
}

// Trains `client`'s job one warm-up and five timed steps, then saves it
// twice (`save`) while it trains on, two steps apart.
absl::StatusOr<SavesWhileTraining> SaveWhileTraining(const LocalCluster& cluster, Client* client,
                                                     uint64_t num_params,
                                                     v1::Coordinator::Stub* coordinator,
                                                     const v1::SaveCheckpointRequest& save) {
  SavesWhileTraining out;
  std::vector<uint64_t> allocated_before_saves;
  {
    Trainer trainer(client, num_params);
    if (absl::Status s = trainer.WaitSteps(6); !s.ok()) return s;
    std::vector<double> durations;
    for (const auto& [begin, end] : trainer.steps()) {
      durations.push_back(absl::ToDoubleSeconds(end - begin));
    }
    durations.erase(durations.begin());
    out.step_s = Median(durations);
    allocated_before_saves = AllocatedBeyond(cluster);
    for (Save& s : out.saves) {
      s.started = absl::Now();
      absl::Status saved = CallUnary(coordinator, &v1::Coordinator::Stub::SaveCheckpoint, save,
                                     &s.info, absl::Hours(1));
      s.ended = absl::Now();
      if (!saved.ok()) return saved;
      if (absl::Status w = trainer.WaitSteps(trainer.steps().size() + 2); !w.ok()) return w;
    }
    if (absl::Status s = trainer.Stop(); !s.ok()) return s;
    for (const auto& [begin, end] : trainer.steps()) {
      for (Save& s : out.saves) {
        if (end <= s.started || begin >= s.ended) continue;
        ++s.steps_during_save;
        s.pause_s += std::max(0.0, absl::ToDoubleSeconds(end - begin) - out.step_s);
      }
    }
  }
  const std::vector<uint64_t> allocated_after_saves = AllocatedBeyond(cluster);
  for (size_t i = 0; i < allocated_after_saves.size(); ++i) {
    out.allocated_during_saves =
        std::max(out.allocated_during_saves, allocated_after_saves[i] - allocated_before_saves[i]);
  }
  return out;
}

// Saves a checkpoint (`save`); returns the seconds that took.
absl::StatusOr<double> TimeSave(v1::Coordinator::Stub* coordinator,
                                const v1::SaveCheckpointRequest& save) {
  v1::CheckpointInfo info;
  const absl::Time started = absl::Now();
  RETURN_IF_ERROR(
      CallUnary(coordinator, &v1::Coordinator::Stub::SaveCheckpoint, save, &info, absl::Hours(1)));
  return absl::ToDoubleSeconds(absl::Now() - started);
}

// Creates a copy of job `job_id` restored from the checkpoint at `path`;
// returns the seconds that took.
absl::StatusOr<double> TimeRestore(v1::Coordinator::Stub* coordinator, const std::string& job_id,
                                   const std::string& path) {
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::JobInfo job;
  RETURN_IF_ERROR(
      CallUnary(coordinator, &v1::Coordinator::Stub::GetJob, get, &job, absl::Seconds(10)));
  v1::CreateJobRequest restore;
  *restore.mutable_spec() = job.spec();
  restore.mutable_spec()->set_job_id(absl::StrCat(job_id, "-restored"));
  restore.set_restore_from(path);
  v1::JobInfo restored;
  const absl::Time started = absl::Now();
  RETURN_IF_ERROR(CallUnary(coordinator, &v1::Coordinator::Stub::CreateJob, restore, &restored,
                            absl::Hours(1)));
  return absl::ToDoubleSeconds(absl::Now() - started);
}

// The most any server's checkpoint copies took at once, allocated beyond
// its kept memory, and were refused for the limit.
struct ArenaPeaks {
  uint64_t peak_bytes = 0, beyond_bytes = 0, refused_bytes = 0;
};
ArenaPeaks ArenaPeaksOf(const LocalCluster& cluster) {
  ArenaPeaks peaks;
  for (const auto& server : cluster.servers()) {
    const StateArena& arena = server->checkpoint_arena();
    peaks.peak_bytes = std::max(peaks.peak_bytes, arena.peak_taken_bytes());
    peaks.beyond_bytes = std::max(peaks.beyond_bytes, arena.allocated_beyond_bytes());
    peaks.refused_bytes = std::max(peaks.refused_bytes, arena.refused_bytes());
  }
  return peaks;
}

// fio's limits for a checkpoint's bytes in `dir`, in GB/s: sequential
// direct I/O in the pieces saves and restores use, 32 in flight over
// kFioFiles files at once.
struct FioRates {
  // Writing new files, as a save does (each checkpoint's files are new),
  // then reading them, as a restore does.
  double write = 0, read = 0;
  // Writing those files again, over their blocks: not a save's bound. On
  // the 2-vCPU VM's ext4, direct writes into blocks a file did not have
  // yet (a new file's, or space fallocate()d) went at 3.1-3.8 GB/s, the
  // disk seeing about 4 of fio's 32 writes in flight, and over written
  // blocks at 7-8.
  double rewrite = 0;
};

// A save writes a file per chunk, a few at once on each server: fio writes
// new files fastest with several at once (on the 2-vCPU VM eight gave
// 3.7-3.8 GB/s, four 3.4-3.6, one 3.1-3.4).
constexpr unsigned kFioFiles = 8;

// fio's write of `bytes` to new files, their read, and a second write over
// them, twice: the better of each pass. The bench runs it before the job
// and after it and takes the better of each again: a cloud disk's rate
// varies from second to second (here 1.5-2.6 GB/s for the same fio write;
// registered reads of 1 MiB 1.35-2.7 GB/s and of 8 MiB 2.2-3.5 GB/s within
// minutes), and a save or a restore that met a faster second than the fio
// runs came out above its bound.
absl::StatusOr<FioRates> FioWriteThenRead(const std::string& dir, uint64_t bytes) {
  auto fio = [&](const std::string& rw) {
    return FioOnce(dir, rw, bytes, kSavedChunkPieceBytes, 32, kFioFiles);
  };
  FioRates best;
  absl::Status status;
  for (int pass = 0; pass < 2 && status.ok(); ++pass) {
    RemoveFioFiles(dir);
    absl::StatusOr<double> written = fio("write");
    absl::StatusOr<double> was_read = written.ok() ? fio("read") : written.status();
    absl::StatusOr<double> rewritten = was_read.ok() ? fio("write") : was_read.status();
    status = rewritten.status();
    if (status.ok()) {
      best.write = std::max(best.write, *written);
      best.read = std::max(best.read, *was_read);
      best.rewrite = std::max(best.rewrite, *rewritten);
    }
  }
  RemoveFioFiles(dir);
  if (!status.ok()) return status;
  return best;
}

// Each server's: two jobs (the trained one and the restored one), with room
// for a chunk more each.
uint64_t HostBudgetBytes(const CheckpointBenchOptions& o) {
  const uint64_t per_server = o.num_params / o.servers + kChunkParams;
  return 2 * ChunkBytes(per_server, DType::kFp16, StatePrecision::kFp32);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> StartCluster(const CheckpointBenchOptions& o) {
  LocalClusterOptions cluster_options;
  cluster_options.num_servers = o.servers;
  cluster_options.executor_threads = o.executor_threads;
  cluster_options.checkpoint_buffer_bytes = o.checkpoint_buffer_bytes;
  cluster_options.checkpoint_memory_limit_bytes = o.checkpoint_memory_limit_bytes;
  // The trainer's steps of big models starve heartbeats to the in-process
  // coordinator on small machines; membership changes are not measured here.
  cluster_options.worker_lease = absl::Minutes(5);
  cluster_options.host_budget_bytes = HostBudgetBytes(o);
  cluster_options.host_prefault_bytes = o.host_prefault_bytes;
  return LocalCluster::Start(cluster_options);
}

}  // namespace

absl::StatusOr<json> BenchCheckpoint(const CheckpointBenchOptions& o) {
  if (o.dir.empty()) return absl::InvalidArgumentError("--dir is required");
  if (o.num_params == 0 || o.num_params % 64 != 0) {
    return absl::InvalidArgumentError("--params must be a positive multiple of 64");
  }
  const std::string dir =
      (std::filesystem::absolute(o.dir) / "strata-bench-checkpoints").lexically_normal().string();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  ASSIGN_OR_RETURN(const auto fio_before,
                   FioWriteThenRead(o.dir, StateBytes(o.num_params, StatePrecision::kFp32)));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, StartCluster(o));
  ClientOptions options;
  options.coordinator_address = cluster->coordinator_address();
  options.job_id = "bench";
  options.job.tensors = {{"w", {static_cast<int64_t>(o.num_params)}}};
  options.job.chunk_num_params = kChunkParams;
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  auto coordinator = v1::Coordinator::NewStub(MakeChannel(options.coordinator_address));
  v1::SaveCheckpointRequest save;
  save.set_job_id(options.job_id);
  save.set_dir(dir);
  // The servers fault in the memory the saves take for second buffers when
  // the job is allocated; the steps are timed after that.
  ASSIGN_OR_RETURN(const double fault_in_s, WaitForFaultIn(*cluster));
  ASSIGN_OR_RETURN(
      const SavesWhileTraining trained,
      SaveWhileTraining(*cluster, client.get(), o.num_params, coordinator.get(), save));
  const Save& first = trained.saves[0];
  const Save& next = trained.saves[1];
  // A third save with the job idle: the disk's rate for a save with the
  // cores to itself, beside the saves that share them with training.
  ASSIGN_OR_RETURN(const double idle_save_s, TimeSave(coordinator.get(), save));
  ASSIGN_OR_RETURN(const double restore_s,
                   TimeRestore(coordinator.get(), options.job_id, next.info.path()));
  const ArenaPeaks peaks = ArenaPeaksOf(*cluster);
  client.reset();
  cluster.reset();
  absl::StatusOr<FioRates> fio = FioWriteThenRead(o.dir, first.info.num_bytes());
  std::filesystem::remove_all(dir, ignored);
  if (!fio.ok()) return fio.status();
  const double fio_write = std::max(fio_before.write, fio->write);
  const double fio_read = std::max(fio_before.read, fio->read);
  const double fio_rewrite = std::max(fio_before.rewrite, fio->rewrite);
  const double bytes = static_cast<double>(first.info.num_bytes());
  const double save_s = first.save_s(), pause_s = first.pause_s;
  return json{{"bench", "checkpoint"},
              {"params", o.num_params},
              {"servers", o.servers},
              {"host_budget_mib", HostBudgetBytes(o) >> 20},
              {"host_prefault_mib", o.host_prefault_bytes >> 20},
              {"bytes", first.info.num_bytes()},
              {"step", next.info.step()},
              {"save_s", save_s},
              {"save_GBps", bytes / save_s / 1e9},
              {"restore_s", restore_s},
              {"restore_GBps", bytes / restore_s / 1e9},
              {"fio_read_GBps", fio_read},
              {"restore_fraction_of_fio_read", bytes / restore_s / 1e9 / fio_read},
              {"write_s", first.info.write_seconds()},
              {"write_GBps", bytes / first.info.write_seconds() / 1e9},
              {"fio_write_GBps", fio_write},
              {"fio_rewrite_GBps", fio_rewrite},
              {"write_fraction_of_fio", bytes / first.info.write_seconds() / 1e9 / fio_write},
              {"save_fraction_of_fio", bytes / save_s / 1e9 / fio_write},
              {"fault_in_s", fault_in_s},
              {"step_s", trained.step_s},
              {"steps_during_save", first.steps_during_save},
              {"pause_s", pause_s},
              {"pause_fraction_of_save", pause_s / save_s},
              {"idle_save_s", idle_save_s},
              {"idle_save_fraction_of_fio", bytes / idle_save_s / 1e9 / fio_write},
              {"next_save_s", next.save_s()},
              {"next_save_fraction_of_fio", bytes / next.save_s() / 1e9 / fio_write},
              {"next_steps_during_save", next.steps_during_save},
              {"next_pause_s", next.pause_s},
              {"next_pause_fraction_of_save", next.pause_s / next.save_s()},
              {"checkpoint_buffer_MiB", o.checkpoint_buffer_bytes >> 20},
              {"copies_peak_MiB", peaks.peak_bytes >> 20},
              {"copies_beyond_buffer_MiB", peaks.beyond_bytes >> 20},
              {"allocated_during_saves_MiB", trained.allocated_during_saves >> 20},
              {"checkpoint_memory_limit_MiB", o.checkpoint_memory_limit_bytes >> 20},
              {"refused_by_limit_MiB", peaks.refused_bytes >> 20}};
}

}  // namespace strata
