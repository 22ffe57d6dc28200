#include "shard/shard_server.h"

#include "absl/strings/str_cat.h"
#include "core/host_port.h"
#include "core/log.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/serve.h"
#include "storage/gpu_tier.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata {
namespace {

absl::Status RegisterWithCoordinator(const ShardServerOptions& options, const std::string& address,
                                     const Tier* gpu) {
  ASSIGN_OR_RETURN(ChannelCredentials credentials, MakeChannelCredentials(options.tls));
  auto stub = v1::Coordinator::NewStub(MakeChannel(options.coordinator_address, credentials));
  v1::RegisterServerRequest request;
  request.mutable_server()->set_address(address);
  request.mutable_server()->set_zone(options.zone);
  request.mutable_server()->set_gpu_budget_bytes(gpu == nullptr ? 0 : gpu->budget_bytes());
  request.mutable_server()->set_host_budget_bytes(options.host_budget_bytes);
  request.mutable_server()->set_nvme_budget_bytes(
      options.nvme_dir.empty() ? 0 : options.nvme_budget_bytes);
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.register_timeout));
  v1::RegisterServerResponse response;
  absl::Status s = FromGrpcStatus(stub->RegisterServer(&context, request, &response));
  if (!s.ok()) {
    // Waiting for a coordinator that never answered is UNAVAILABLE (shard_server.h).
    const absl::StatusCode code =
        s.code() == absl::StatusCode::kDeadlineExceeded ? absl::StatusCode::kUnavailable : s.code();
    return absl::Status(code, absl::StrCat("registering with coordinator ",
                                           options.coordinator_address, ": ", s.message()));
  }
  return absl::OkStatus();
}

// The GPU tier the options ask for; nullptr for none.
absl::StatusOr<std::unique_ptr<Tier>> OpenGpuTierOf(const ShardServerOptions& options) {
  if (options.gpu_budget_bytes == ShardServerOptions::kNoGpuTier) return nullptr;
  if (options.gpu_budget_bytes == ShardServerOptions::kAutoGpuBudget) {
    if (options.gpu_device >= GpuCount()) {
      LogEventCat("server", "no GPU ", options.gpu_device, " found: no gpu tier");
      return nullptr;
    }
    return OpenGpuTier(options.gpu_device, 0);
  }
  if (options.gpu_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU tier budget ", options.gpu_budget_bytes, " is negative"));
  }
  return OpenGpuTier(options.gpu_device, static_cast<uint64_t>(options.gpu_budget_bytes));
}

// The address the server announces: `advertise` (HOST:PORT, or a HOST given
// the port of `bound`), or `bound`.
absl::StatusOr<std::string> Advertised(const std::string& advertise, const std::string& bound) {
  if (advertise.empty()) return bound;
  if (ValidateHostPort("--advertise", advertise).ok()) return advertise;
  const std::string address = absl::StrCat(advertise, bound.substr(bound.rfind(':')));
  RETURN_IF_ERROR(ValidateHostPort("--advertise", address));
  return address;
}

// The options' own checks, before anything is opened.
absl::Status ValidateOptions(const ShardServerOptions& options) {
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("a coordinator address is required");
  }
  if (options.executor_threads < 1 || options.nvme_executor_threads < 1) {
    return absl::InvalidArgumentError("executor threads and NVMe executor threads must be >= 1");
  }
  if (options.max_pull_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_pull_wait must be positive, not ",
                                                   absl::FormatDuration(options.max_pull_wait)));
  }
  if (options.storage_probe_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage_probe_interval must be positive, not ",
                     absl::FormatDuration(options.storage_probe_interval)));
  }
  if (options.checkpoint_memory_limit_bytes < options.checkpoint_buffer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint memory limit (",
                                                   options.checkpoint_memory_limit_bytes >> 20,
                                                   " MiB) is below the checkpoint buffer kept (",
                                                   options.checkpoint_buffer_bytes >> 20, " MiB)"));
  }
  if (options.auth && !options.tls.enabled()) {
    return absl::InvalidArgumentError(
        "--auth needs TLS (--tls_cert, --tls_key, --tls_ca): the coordinator is known by its "
        "certificate, and tokens travel in the clear without it");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const ShardServerOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<ShardServer> server(new ShardServer());
  server->save_host_chunks_ = options.save_host_chunks;
  RETURN_IF_ERROR(server->OpenStorage(options));
  RETURN_IF_ERROR(server->MakeService(options));
  RETURN_IF_ERROR(server->ServeAndRegister(options));
  server->StartStorageProbe(options);
  server->LogServing(options);
  return server;
}

absl::Status ShardServer::OpenStorage(const ShardServerOptions& options) {
  ASSIGN_OR_RETURN(metadata_, MetadataStore::OpenInDataDir(options.data_dir));
  ASSIGN_OR_RETURN(gpu_, OpenGpuTierOf(options));
  // With a GPU tier, the host tier is pinned for the GPU: the chunks' copies
  // come back by DMA.
  const HostTier::Pinning pinning = !options.pin_host_memory ? HostTier::Pinning::kNone
                                    : gpu_ != nullptr        ? HostTier::Pinning::kGpu
                                                             : HostTier::Pinning::kMlock;
  tier_ = std::make_unique<HostTier>(options.host_budget_bytes, pinning);
  if (options.host_prefault_bytes > options.host_budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_prefault_bytes (--host_prefault_mib) of ", options.host_prefault_bytes,
        " exceeds the host budget of ", options.host_budget_bytes, " bytes (--host_budget_mib)"));
  }
  const absl::Time prefault_started = absl::Now();
  if (absl::Status s = tier_->Prefault(options.host_prefault_bytes); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("faulting in --host_prefault_mib: ", s.message()));
  }
  host_prefault_time_ = absl::Now() - prefault_started;
  if (!options.nvme_dir.empty()) {
    ASSIGN_OR_RETURN(nvme_,
                     NvmeTier::Open(NvmeTierOptions{options.nvme_dir, options.nvme_budget_bytes,
                                                    options.nvme_queue_depth}));
  }
  executor_ = std::make_unique<ThreadPool>(options.executor_threads);
  if (nvme_ != nullptr)
    nvme_executor_ = std::make_unique<ThreadPool>(options.nvme_executor_threads);
  checkpoint_arena_ = std::make_unique<StateArena>(options.checkpoint_buffer_bytes,
                                                   options.checkpoint_memory_limit_bytes);
  return absl::OkStatus();
}

absl::Status ShardServer::MakeService(const ShardServerOptions& options) {
  std::optional<PathRoot> root;
  if (!options.checkpoint_root.empty()) {
    ASSIGN_OR_RETURN(root, PathRoot::Open(options.checkpoint_root, "checkpoint_root"));
  }
  ASSIGN_OR_RETURN(service_, ShardService::Create(
                                 gpu_.get(), tier_.get(), nvme_.get(), metadata_.get(),
                                 executor_.get(), nvme_executor_.get(), checkpoint_arena_.get(),
                                 absl::StrCat(options.data_dir, "/saved-chunks"), std::move(root)));
  ASSIGN_OR_RETURN(metrics_, Metrics::Start(options.metrics_listen_address));
  service_->ExportMetrics(metrics_.get());
  service_->set_max_pull_wait(options.max_pull_wait);
  // A seed reads the source server as a worker of the job (with its token):
  // with the CA alone, as this server's own certificate would make it a
  // shard server there, which reads no job's state.
  TlsFiles ca_only;
  ca_only.ca_file = options.tls.ca_file;
  service_->set_source_dialer(
      [ca_only](const std::string& address,
                const std::string& token) -> absl::StatusOr<std::shared_ptr<grpc::Channel>> {
        ASSIGN_OR_RETURN(ChannelCredentials credentials, MakeChannelCredentials(ca_only, token));
        return MakeChannel(address, credentials);
      });
  if (options.auth) {
    ASSIGN_OR_RETURN(auth_, Authenticator::Create("", service_.get()));
    authorized_ = std::make_unique<AuthorizedShardServer>(service_.get(), auth_.get());
  }
  return absl::OkStatus();
}

absl::Status ShardServer::ServeAndRegister(const ShardServerOptions& options) {
  grpc::Service* served =
      authorized_ != nullptr ? static_cast<grpc::Service*>(authorized_.get()) : service_.get();
  std::string bound;
  ASSIGN_OR_RETURN(server_,
                   Serve(options.listen_address, options.tls, served, metrics_.get(), &bound));
  ASSIGN_OR_RETURN(address_, Advertised(options.advertise_address, bound));
  RETURN_IF_ERROR(RegisterWithCoordinator(options, address_, gpu_.get()));
  // A chunk whose state is lost: the coordinator hears of it when the server
  // registers again (it lists the chunks then).
  reporter_ = std::make_unique<ThreadPool>(1);
  service_->set_on_chunk_lost([this, options] {
    reporter_->Schedule([this, options] {
      absl::Status s = RegisterWithCoordinator(options, address_, gpu_.get());
      LogEventCat("server", "reported a lost chunk to the coordinator",
                  s.ok() ? "" : absl::StrCat(": ", s.message()));
    });
  });
  MarkServing(server_.get(), v1::ShardServer::service_full_name());
  return absl::OkStatus();
}

void ShardServer::StartStorageProbe(const ShardServerOptions& options) {
  std::vector<std::string> probed = {options.data_dir};
  if (!options.nvme_dir.empty()) probed.push_back(options.nvme_dir);
  grpc::Server* grpc_server = server_.get();
  storage_probe_ = std::make_unique<StorageProbe>(
      options.storage_probe_interval, std::move(probed), metadata_.get(),
      [grpc_server](bool healthy) {
        MarkServing(grpc_server, v1::ShardServer::service_full_name(), healthy);
      });
}

void ShardServer::LogServing(const ShardServerOptions& options) const {
  LogEventCat(
      "server", "serving on ", address_, " with ",
      gpu_ == nullptr ? std::string("no gpu tier")
                      : absl::StrCat("a gpu tier of ", gpu_->budget_bytes(), " bytes on GPU ",
                                     options.gpu_device),
      ", a ", options.pin_host_memory ? "page-locked " : "", "host tier of ",
      options.host_budget_bytes, " bytes (",
      options.host_prefault_bytes == 0
          ? std::string("none faulted in ahead")
          : absl::StrCat(options.host_prefault_bytes, " faulted in at start-up in ",
                         absl::ToDoubleSeconds(host_prefault_time_), " s"),
      "), ",
      nvme_ == nullptr
          ? std::string("no nvme tier")
          : absl::StrCat("an nvme tier of ", nvme_->budget_bytes(), " bytes in ", nvme_->path(),
                         " (", options.nvme_executor_threads, " NVMe executor thread(s))"),
      ", ", options.executor_threads, " executor thread(s) and ",
      checkpoint_arena_->retained_bytes(), " bytes kept for checkpoint buffers; ",
      DescribeTls(options.tls), "; ",
      options.auth ? "authentication on: the coordinator's certificate, the jobs' worker "
                     "tokens"
                   : DescribeAuth(nullptr));
}

ShardServer::~ShardServer() { Shutdown(); }

void ShardServer::Shutdown() {
  if (server_ == nullptr) return;
  storage_probe_.reset();
  server_->GetHealthCheckService()->Shutdown();  // NOT_SERVING from now on
  service_->BeginShutdown();                     // refuses new work, answers waiting pulls
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server_.reset();
  // Pull answers reference chunks' memory until gRPC lets go of them: the
  // tiers that memory belongs to are freed only after.
  if (!service_->AwaitAnswersReleased(absl::Now() + kShutdownGrace)) {
    LogEventCat("server", "gRPC still holds pull answers ", absl::FormatDuration(kShutdownGrace),
                " after shutting down; the memory of their chunks is kept until the process "
                "exits");
    (void)tier_.release();
    (void)gpu_.release();
    (void)nvme_.release();
    (void)checkpoint_arena_.release();
  }
  executor_.reset();  // in-flight steps finish
  nvme_executor_.reset();
  reporter_.reset();
  if (save_host_chunks_) service_->SaveMemoryChunks();
  metrics_.reset();  // before the service its scrapes read
  authorized_.reset();
  service_.reset();
  auth_.reset();
  metadata_.reset();  // closes RocksDB
  LogEventCat("server", "shut down ", address_);
}

}  // namespace strata
