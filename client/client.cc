// ClientImpl (client_impl.h): joining and leaving the job, and writing its
// initial state; Client::Connect.
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client_impl.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"
#include "rpc/token.h"

namespace strata {
namespace {

TlsFiles TlsFilesOf(const ClientOptions& options) {
  return TlsFiles{options.tls_cert_file, options.tls_key_file, options.tls_ca_file};
}

std::string DefaultWorkerId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

// The job's spec as the coordinator records it: the one conversion of
// JobOptions.
v1::JobSpec JobSpecOf(const std::string& job_id, const JobOptions& job) {
  v1::JobSpec spec;
  spec.set_job_id(job_id);
  for (const TensorSpec& t : job.tensors) {
    v1::TensorSpec* out = spec.add_tensors();
    out->set_name(t.name);
    for (int64_t d : t.shape) out->add_shape(d);
    out->set_group(t.group);
  }
  for (const ParamGroup& g : job.groups) spec.add_groups()->set_weight_decay(g.weight_decay);
  spec.set_world_size(job.world_size);
  spec.set_samples_per_step(job.samples_per_step);
  spec.set_chunk_num_params(job.chunk_num_params);
  *spec.mutable_adam() = AdamToProto(job.adam);
  spec.set_dtype(DTypeToProto(job.dtype));
  // FP32 is the default, written as none (as with replicas below).
  if (job.state_precision != StatePrecision::kFp32) {
    spec.set_state_precision(StatePrecisionToProto(job.state_precision));
  }
  spec.set_checkpoint_every_steps(job.checkpoint_every_steps);
  spec.set_checkpoint_dir(job.checkpoint_dir);
  spec.set_checkpoint_keep_last(job.checkpoint_keep_last);
  // One copy is the default, written as none (the specs of jobs made before
  // replicas existed compare equal).
  if (job.replicas > 1) spec.set_replicas(job.replicas);
  return spec;
}

}  // namespace

ClientImpl::ClientImpl(ClientOptions options, FlatLayout layout, ChannelCredentials credentials,
                       std::unique_ptr<Device> device)
    : options_(std::move(options)),
      worker_id_(options_.worker_id.empty() ? DefaultWorkerId() : options_.worker_id),
      layout_(std::move(layout)),
      esize_(DTypeSize(options_.job.dtype)),
      credentials_(std::move(credentials)),
      transport_(options_.job_id, &layout_, options_.job.dtype, TlsFilesOf(options_)),
      scaler_(options_.loss_scale),
      coordinator_(
          v1::Coordinator::NewStub(MakeChannel(options_.coordinator_address, credentials_))),
      device_(std::move(device)),
      grads_(device_.get(), options_.params == ParamResidency::kOnDemand),
      gatherer_(&collective_thread_) {}

absl::Status ClientImpl::CreateJob() {
  absl::Time deadline = absl::Now() + options_.rendezvous_timeout;
  v1::CreateJobRequest create;
  *create.mutable_spec() = JobSpecOf(options_.job_id, options_.job);
  create.set_restore_from(options_.initial.checkpoint);
  v1::JobInfo job;
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    job.Clear();
    absl::Status s = FromGrpcStatus(coordinator_->CreateJob(&context, create, &job));
    if (s.ok()) break;
    // UNAVAILABLE: another worker is creating the job right now.
    if (!absl::IsUnavailable(s) || absl::Now() > deadline) {
      // No connection: a coordinator that is down or speaks TLS otherwise.
      const bool unreached = absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
      const char* hint =
          !unreached ? ""
          : options_.tls_ca_file.empty()
              ? " (not reached: is it up? If it uses TLS, set tls_ca_file to its CA)"
              : " (not reached: is it up, does its TLS certificate chain to tls_ca_file, and "
                "is the certificate presented (tls_cert_file) one of that CA's?)";
      return absl::Status(s.code(),
                          absl::StrCat("creating job '", options_.job_id, "' at coordinator ",
                                       options_.coordinator_address, ": ", s.message(), hint));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return transport_.SetPlacement(std::move(job));
}

absl::Status ClientImpl::WriteInitialParams() {
  const std::vector<float>& p = options_.initial.params;
  return transport_.SendPieces(
      sizeof(float), &v1::ShardServer::Stub::WriteParams,
      [&](const Piece& piece, v1::WriteParamsRequest* request) {
        request->mutable_params()->Add(p.begin() + piece.begin, p.begin() + piece.begin + piece.n);
      },
      kControlRpcTimeout);
}

absl::Status ClientImpl::WriteInitialState() {
  const std::string& path = options_.initial.safetensors_path;
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  const uint64_t n = layout_.num_params();
  std::vector<float> p(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  // Moments come for every tensor or for none.
  std::optional<bool> with_moments;
  for (size_t i = 0; i < options_.job.tensors.size(); ++i) {
    const TensorSpec& spec = options_.job.tensors[i];
    const FlatRange range = layout_.tensor_range(i);
    auto copy_tensor = [&](const std::string& name, std::vector<float>& to) -> absl::Status {
      auto it = file.tensors.find(name);
      if (it == file.tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, " has no tensor '", name, "'"));
      }
      if (it->second.shape != spec.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", name, "' of ", path, " has shape [", absl::StrJoin(it->second.shape, ","),
            "]; the model registers [", absl::StrJoin(spec.shape, ","), "]"));
      }
      std::copy(it->second.values.begin(), it->second.values.end(), to.begin() + range.begin);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(copy_tensor(spec.name, p));
    bool has = file.tensors.count(spec.name + ".exp_avg") > 0;
    if (with_moments.has_value() && *with_moments != has) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " has Adam moments for some tensors and not for '", spec.name, "'"));
    }
    with_moments = has;
    if (has) {
      RETURN_IF_ERROR(copy_tensor(spec.name + ".exp_avg", m));
      RETURN_IF_ERROR(copy_tensor(spec.name + ".exp_avg_sq", v));
    }
  }
  int64_t step = 0;
  if (with_moments.value_or(false) && !absl::SimpleAtoi(file.metadata["strata_step"], &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has Adam moments but no strata_step in its metadata"));
  }
  RETURN_IF_ERROR(transport_.SendPieces(
      3 * sizeof(float), &v1::ShardServer::Stub::WriteState,
      [&](const Piece& piece, v1::WriteStateRequest* request) {
        request->set_step(step);
        request->mutable_params()->Add(p.begin() + piece.begin, p.begin() + piece.begin + piece.n);
        request->mutable_exp_avg()->Add(m.begin() + piece.begin, m.begin() + piece.begin + piece.n);
        request->mutable_exp_avg_sq()->Add(v.begin() + piece.begin,
                                           v.begin() + piece.begin + piece.n);
      },
      kControlRpcTimeout));
  LogEventCat("client", "job ", options_.job_id, ": state of step ", step, " written from ", path);
  return absl::OkStatus();
}

absl::Status ClientImpl::Init() {
  RETURN_IF_ERROR(CreateJob());
  ASSIGN_OR_RETURN(membership_, WorkerMembership::Join(
                                    options_.coordinator_address, credentials_, options_.job_id,
                                    worker_id_, [this](uint64_t running, bool members_changed) {
                                      CancelInFlight(running, members_changed);
                                    }));
  return Reform(/*than=*/0);
}

absl::Status ClientImpl::Leave() {
  DropStream();
  // ABORTED: a member that left first ended the group's collectives, this
  // worker's last all-gather with them; it leaves all the same (nothing can
  // read its parameters afterwards).
  if (absl::Status drained = DrainGathers(); !drained.ok() && !absl::IsAborted(drained)) {
    return drained;
  }
  // The others re-form without this worker: after its last step where it
  // announced the leave, else once the coordinator's generation cuts their
  // step short (as for a lost worker).
  RETURN_IF_ERROR(membership_->Leave().status());
  SetCollective(nullptr, 0);
  membership_.reset();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (options.job.world_size < 1) return absl::InvalidArgumentError("world_size must be >= 1");
  if (options.bucket_num_params == 0) {
    return absl::InvalidArgumentError("bucket_num_params must be > 0");
  }
  if (options.collective != "gloo" && options.collective != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("collective '", options.collective, "' is not gloo or nccl"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Device> device, OpenDevice(options.device));
  if (!device->is_host() && options.collective != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device->name(), " needs collective nccl; collective '",
                     options.collective, "' works on host memory (device cpu)"));
  }
  ASSIGN_OR_RETURN(FlatLayout layout,
                   FlatLayout::Create(options.job.tensors, options.job.chunk_num_params));
  if (!options.initial.params.empty() + !options.initial.safetensors_path.empty() +
          !options.initial.checkpoint.empty() >
      1) {
    return absl::InvalidArgumentError(
        "give at most one of initial.params, initial.safetensors_path and initial.checkpoint");
  }
  if (!options.initial.params.empty() && options.initial.params.size() != layout.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial.params has ", options.initial.params.size(),
                     " values; the flat layout has ", layout.num_params()));
  }
  std::string token;
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(options.token_file, "token_file"));
  }
  ASSIGN_OR_RETURN(ChannelCredentials credentials,
                   MakeChannelCredentials(TlsFilesOf(options), token));
  auto client = std::make_unique<ClientImpl>(std::move(options), std::move(layout),
                                             std::move(credentials), std::move(device));
  RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace strata
