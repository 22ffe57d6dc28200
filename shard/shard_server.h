// ShardServer: an in-process shard server daemon -- its RocksDB metadata, its
// tiers (GPU where found, host, optional NVMe), its step executors and its
// gRPC server, registered with the coordinator. strata-server's main() runs
// one; tests and strata-bench start several in one process. Start() returns
// once serving, and answers NOT_SERVING to health checks while its storage
// fails; Shutdown() (also run by the destructor) answers waiting
// pulls, lets in-flight steps finish, stops gRPC, saves host-memory chunks
// and closes RocksDB. Not thread-safe: one owner calls Shutdown.
#ifndef STRATA_SHARD_SHARD_SERVER_H_
#define STRATA_SHARD_SHARD_SERVER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/thread_pool.h"
#include "rpc/authenticator.h"
#include "rpc/authorized_services.h"
#include "rpc/metrics.h"
#include "rpc/tls.h"
#include "shard/shard_service.h"
#include "shard/state_arena.h"
#include "shard/storage_probe.h"
#include "storage/host_tier.h"
#include "storage/metadata_store.h"
#include "storage/nvme_tier.h"

namespace strata {

struct ShardServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0 picks a free port
  // Address announced to the coordinator: HOST:PORT, or a HOST alone with
  // the bound port (listening on 0.0.0.0:0 behind a name, in another network
  // namespace, behind NAT); default: the listen host and bound port.
  std::string advertise_address;
  // The failure domain announced to the coordinator (ServerRecord.zone):
  // a chunk's copies go to distinct zones where the fleet allows.
  std::string zone;
  std::string coordinator_address;
  std::string data_dir;  // RocksDB metadata lives in data_dir/metadata
  // The directory every checkpoint directory of a SaveChunks or LoadChunks
  // must resolve inside; empty: this server takes no checkpoints.
  std::string checkpoint_root;
  // Its server's certificate, also presented to the coordinator; plaintext
  // without (rpc/tls.h).
  TlsFiles tls;
  // Authentication (needs `tls`): control RPCs from the coordinator's
  // certificate only, a job's RPCs from callers presenting its worker token
  // (rpc/auth_policy.h). Off: any caller may do anything.
  bool auth = false;
  // The GPU tier on GPU gpu_device: gpu_budget_bytes, or kNoGpuTier, or
  // kAutoGpuBudget (80% of the GPU's free memory at start-up where a GPU is
  // found, no GPU tier where none is).
  static constexpr int64_t kNoGpuTier = 0;
  static constexpr int64_t kAutoGpuBudget = -1;
  int gpu_device = 0;
  int64_t gpu_budget_bytes = kNoGpuTier;
  uint64_t host_budget_bytes = uint64_t{1} << 30;
  // Host memory faulted in (and page-locked) at start-up and kept for
  // chunks, so that new jobs, restores and moves take memory faulted in
  // already; at most host_budget_bytes.
  uint64_t host_prefault_bytes = 0;
  // Page-lock the host tier (mlock): it is never swapped out.
  bool pin_host_memory = true;
  // The NVMe tier: a preallocated file in nvme_dir (empty: no NVMe tier).
  std::string nvme_dir;
  uint64_t nvme_budget_bytes = 0;
  unsigned nvme_queue_depth = 32;
  int executor_threads = 2;
  // Threads that apply the chunks whose state is on NVMe (with an NVMe
  // tier). Each holds one chunk's read, update or write at a time, so more
  // threads than cores keep the disk's queue full while some of them
  // compute and checksum; each takes a staging buffer of a chunk's state.
  static constexpr int kDefaultNvmeExecutorThreads = 4;
  int nvme_executor_threads = kDefaultNvmeExecutorThreads;
  // Host memory kept, faulted in from the start, for the chunk states that
  // checkpoints keep aside while training goes on (server/state_arena.h).
  // Beyond it, what each job's saves take is faulted in when the job's chunks
  // are allocated and kept while the job lives, up to
  // `checkpoint_memory_limit_bytes` in all (at least the kept bytes). Past
  // the limit, a training step writes a chunk's state to the checkpoint
  // itself before it updates the chunk.
  uint64_t checkpoint_buffer_bytes = 0;
  static constexpr uint64_t kDefaultCheckpointMemoryLimitBytes = uint64_t{4096} << 20;
  uint64_t checkpoint_memory_limit_bytes = kDefaultCheckpointMemoryLimitBytes;
  absl::Duration register_timeout = absl::Seconds(30);
  // The longest a pull waits for its chunk's next step before it is answered
  // DEADLINE_EXCEEDED (its caller's own deadline or cancellation may end it
  // first).
  absl::Duration max_pull_wait = absl::Minutes(10);
  // host:port of the Prometheus endpoint (/metrics); empty: none.
  std::string metrics_listen_address;
  // Save host-memory chunk states to data_dir at a clean shutdown, for the
  // next start-up (ShardService::SaveMemoryChunks); GPU-tier chunk states too.
  bool save_host_chunks = true;
  // How often data_dir, nvme_dir and RocksDB are probed with a synced write
  // (shard/storage_probe.h): the server answers NOT_SERVING while they fail.
  absl::Duration storage_probe_interval = absl::Seconds(1);
};

class ShardServer {
 public:
  // UNAVAILABLE when the coordinator cannot be reached within register_timeout.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const ShardServerOptions& options);
  ~ShardServer();
  const std::string& address() const { return address_; }
  // host:port of the metrics endpoint; empty without one.
  const std::string& metrics_address() const { return metrics_->address(); }
  // The threads that apply NVMe-tier chunks; nullptr without an NVMe tier.
  ThreadPool* nvme_executor() const { return nvme_executor_.get(); }
  // The memory checkpoint copies are made in.
  const StateArena& checkpoint_arena() const { return *checkpoint_arena_; }
  void Shutdown();

 private:
  ShardServer() = default;
  // The steps of Start(), in order: the metadata store, tiers, executors
  // and checkpoint arena; the service over them (its metrics, seed dialer
  // and, with auth, the authorizing wrapper); serving and registering; the
  // storage probe; the start-up line.
  absl::Status OpenStorage(const ShardServerOptions& options);
  absl::Status MakeService(const ShardServerOptions& options);
  absl::Status ServeAndRegister(const ShardServerOptions& options);
  void StartStorageProbe(const ShardServerOptions& options);
  void LogServing(const ShardServerOptions& options) const;

  std::string address_;
  std::unique_ptr<Metrics> metrics_;
  bool save_host_chunks_ = true;
  std::unique_ptr<MetadataStore> metadata_;
  std::unique_ptr<Tier> gpu_;  // nullptr: no GPU tier
  std::unique_ptr<HostTier> tier_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<ThreadPool> executor_;
  std::unique_ptr<ThreadPool> nvme_executor_;
  std::unique_ptr<StateArena> checkpoint_arena_;
  absl::Duration host_prefault_time_;  // to fault host_prefault_bytes in at start-up
  std::unique_ptr<ShardService> service_;
  // With `auth`: who calls, and the gate every call passes.
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AuthorizedShardServer> authorized_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<StorageProbe> storage_probe_;  // sets server_'s health
  // Registers again with the coordinator, which then lists the server's
  // chunks and finds those lost; one registration at a time.
  std::unique_ptr<ThreadPool> reporter_;
};

}  // namespace strata

#endif  // STRATA_SHARD_SHARD_SERVER_H_
