#include "client/shard_transport.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/step_exchange.h"
#include "core/status_macros.h"
#include "rpc/grpc_status.h"

namespace strata {
namespace {

// Parameters a ReadState reads at a time (12 bytes each).
constexpr uint64_t kMaxStateReadParams = uint64_t{256} << 10;
// ReadMasterState reads a job between two steps again this often, 50 ms apart.
constexpr int kStateReadAttempts = 100;

}  // namespace

ShardTransport::ShardTransport(std::string job_id, const FlatLayout* layout, DType dtype,
                               TlsFiles tls)
    : job_id_(std::move(job_id)),
      layout_(layout),
      dtype_(dtype),
      esize_(DTypeSize(dtype)),
      tls_(std::move(tls)) {}

absl::Status ShardTransport::SetPlacement(v1::JobInfo job) {
  if (static_cast<uint32_t>(job.chunks_size()) != layout_->num_chunks()) {
    return absl::InternalError("the coordinator's job has a different number of chunks");
  }
  if (credentials_ == nullptr || credentials_token_ != job.worker_token()) {
    ASSIGN_OR_RETURN(credentials_, MakeChannelCredentials(tls_, job.worker_token()));
    credentials_token_ = job.worker_token();
    servers_.clear();  // their channels presented another token
  }
  job_ = std::move(job);
  // The servers of the placement, keeping the channels of those that stay;
  // a server the chunks left gets no more calls (its commits would fail).
  std::map<std::string, Server> placed;
  auto add = [&](const std::string& address) {
    Server& server = placed[address];
    if (server.channel != nullptr) return;
    if (auto kept = servers_.find(address); kept != servers_.end()) {
      server = std::move(kept->second);
      return;
    }
    server.channel = MakeChannel(address, credentials_);
    server.stub = v1::ShardServer::NewStub(server.channel);
    server.generic = std::make_unique<grpc::GenericStub>(server.channel);
  };
  for (const auto& c : job_.chunks()) {
    add(c.server_address());
    for (const std::string& address : c.replica_addresses()) add(address);
  }
  servers_ = std::move(placed);
  return absl::OkStatus();
}

std::vector<Piece> ShardTransport::PiecesOf(FlatRange range, uint64_t max_params) const {
  std::vector<Piece> pieces;
  uint64_t chunk = layout_->chunk_num_params();
  for (uint64_t begin = range.begin; begin < range.end;) {
    uint64_t chunk_end = std::min(range.end, (begin / chunk + 1) * chunk);
    uint64_t end = std::min(chunk_end, begin + max_params);
    const v1::ChunkAssignment& assignment = job_.chunks(static_cast<int>(begin / chunk));
    Piece& piece = pieces.emplace_back(Piece{begin, end - begin, {}});
    auto add = [&](const std::string& address) {
      const Server& server = servers_.at(address);
      piece.copies.push_back(
          {server.channel.get(), server.stub.get(), server.generic.get(), address});
    };
    add(assignment.server_address());
    for (const std::string& address : assignment.replica_addresses()) add(address);
    begin = end;
  }
  return pieces;
}

absl::Status ShardTransport::CommitStep(int64_t step, uint64_t generation, uint32_t attempt,
                                        const PushScalars& push, absl::Duration timeout) const {
  v1::CommitStepRequest request;
  request.set_job_id(job_id_);
  request.set_step(step);
  request.set_generation(generation);
  request.set_attempt(attempt);
  request.set_coef(push.coef);
  if (push.lr.has_value()) request.set_lr(*push.lr);
  request.mutable_group_lrs()->Add(push.group_lrs.begin(), push.group_lrs.end());
  *request.mutable_loss_scale_after() = push.loss_scale_after;
  for (const auto& [address, server] : servers_) {
    v1::CommitStepResponse response;
    absl::Status s = CallUnary(server.stub.get(), &v1::ShardServer::Stub::CommitStep, request,
                               &response, timeout);
    if (!s.ok()) return WithShardAddress(s, address);
  }
  return absl::OkStatus();
}

absl::StatusOr<MasterState> ShardTransport::ReadMasterState(absl::Duration timeout) const {
  MasterState state;
  const uint64_t n = layout_->num_params();
  state.params.resize(n);
  state.exp_avg.resize(n);
  state.exp_avg_sq.resize(n);
  const std::vector<Piece> pieces = PiecesOf({0, n}, kMaxStateReadParams);
  for (int attempt = 0; attempt < kStateReadAttempts; ++attempt) {
    std::set<int64_t> steps;
    for (const Piece& piece : pieces) {
      v1::ReadStateRequest request;
      request.set_job_id(job_id_);
      request.set_flat_begin(piece.begin);
      request.set_num_params(piece.n);
      v1::ReadStateResponse response;
      absl::Status s = CallUnary(piece.primary().stub, &v1::ShardServer::Stub::ReadState, request,
                                 &response, timeout);
      if (!s.ok()) return WithShardAddress(s, piece.primary().address);
      if (static_cast<uint64_t>(response.params_size()) != piece.n ||
          response.exp_avg_size() != response.params_size() ||
          response.exp_avg_sq_size() != response.params_size()) {
        return WithShardAddress(
            absl::InternalError("ReadState returned the wrong number of values"),
            piece.primary().address);
      }
      std::copy(response.params().begin(), response.params().end(), &state.params[piece.begin]);
      std::copy(response.exp_avg().begin(), response.exp_avg().end(), &state.exp_avg[piece.begin]);
      std::copy(response.exp_avg_sq().begin(), response.exp_avg_sq().end(),
                &state.exp_avg_sq[piece.begin]);
      steps.insert(response.applied_step());
    }
    if (steps.size() <= 1) {
      state.step = steps.empty() ? 0 : *steps.begin();
      return state;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::AbortedError(
      absl::StrCat("job '", job_id_, "' kept changing steps while it was read; retry"));
}

absl::Status ShardTransport::LostGeneration(const StepTransfer& transfer) {
  return absl::AbortedError(absl::StrCat("generation ", transfer.generation,
                                         " lost a worker; step ", transfer.step, " is recomputed"));
}

void ShardTransport::CancelGeneration(uint64_t generation) {
  absl::MutexLock lock(&inflight_mu_);
  lost_generation_ = generation;
  if (running_ != nullptr && running_->transfer().generation == generation) {
    running_->Cancel(LostGeneration(running_->transfer()));
  }
}

absl::Status ShardTransport::PushPull(const StepTransfer& transfer) {
  StepExchange exchange(job_id_, dtype_, transfer);
  {
    absl::MutexLock lock(&inflight_mu_);
    if (lost_generation_ == transfer.generation) return LostGeneration(transfer);
    running_ = &exchange;
  }
  absl::Status s = exchange.Run();
  absl::MutexLock lock(&inflight_mu_);
  running_ = nullptr;
  return s;
}

}  // namespace strata
