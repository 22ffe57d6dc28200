#include "client/shard_transport.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_status.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

// Parameters a ReadState reads at a time (12 bytes each).
constexpr uint64_t kMaxStateReadParams = uint64_t{256} << 10;
// ReadMasterState reads a job between two steps again this often, 50 ms apart.
constexpr int kStateReadAttempts = 100;

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

ShardTransport::ShardTransport(std::string job_id, const FlatLayout* layout, DType dtype,
                               ChannelCredentials credentials)
    : job_id_(std::move(job_id)),
      layout_(layout),
      dtype_(dtype),
      esize_(DTypeSize(dtype)),
      credentials_(std::move(credentials)) {}

absl::Status ShardTransport::SetPlacement(v1::JobInfo job) {
  if (static_cast<uint32_t>(job.chunks_size()) != layout_->num_chunks()) {
    return absl::InternalError("the coordinator's job has a different number of chunks");
  }
  job_ = std::move(job);
  for (const auto& c : job_.chunks()) {
    auto& stub = stubs_[c.server_address()];
    if (stub == nullptr)
      stub = v1::ShardServer::NewStub(MakeChannel(c.server_address(), credentials_));
  }
  return absl::OkStatus();
}

std::vector<Piece> ShardTransport::PiecesOf(FlatRange range, uint64_t max_params) const {
  std::vector<Piece> pieces;
  uint64_t chunk = layout_->chunk_num_params();
  for (uint64_t begin = range.begin; begin < range.end;) {
    uint64_t chunk_end = std::min(range.end, (begin / chunk + 1) * chunk);
    uint64_t end = std::min(chunk_end, begin + max_params);
    const std::string& address = job_.chunks(static_cast<int>(begin / chunk)).server_address();
    pieces.push_back(Piece{begin, end - begin, stubs_.at(address).get(), address});
    begin = end;
  }
  return pieces;
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
      absl::Status s =
          CallUnary(piece.stub, &v1::ShardServer::Stub::ReadState, request, &response, timeout);
      if (!s.ok()) return WithShardAddress(s, piece.address);
      if (static_cast<uint64_t>(response.params_size()) != piece.n ||
          response.exp_avg_size() != response.params_size() ||
          response.exp_avg_sq_size() != response.params_size()) {
        return WithShardAddress(
            absl::InternalError("ReadState returned the wrong number of values"), piece.address);
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

void ShardTransport::CancelGeneration(uint64_t generation) {
  absl::MutexLock lock(&inflight_mu_);
  lost_generation_ = generation;
  for (grpc::ClientContext* context : inflight_) context->TryCancel();
}

absl::Status ShardTransport::PushPull(const StepTransfer& transfer) {
  const std::vector<Piece>& pieces = *transfer.pieces;
  const int64_t step = transfer.step;
  const PushScalars* push = transfer.push;
  struct Call {
    grpc::ClientContext push_context, pull_context;
    v1::PushRequest push_request;
    v1::PushResponse push_response;
    v1::PullRequest pull_request;
    v1::PullResponse pull_response;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (size_t i = 0; i < pieces.size(); ++i) calls.push_back(std::make_unique<Call>());
  {
    absl::MutexLock lock(&inflight_mu_);
    if (lost_generation_ == transfer.generation) {
      return absl::AbortedError(absl::StrCat("generation ", transfer.generation,
                                             " lost a worker; step ", step, " is recomputed"));
    }
    for (auto& c : calls) inflight_.insert(inflight_.end(), {&c->push_context, &c->pull_context});
  }
  // Pieces go out in flat order, pushes and pulls each within a window of
  // bytes in flight (at least two chunks and a piece, so that a chunk that
  // waits for another worker's pushes never stalls the rest), so that a
  // shard server holds a bounded part of this worker's step: pushes stay in
  // it until their chunk is applied, pull responses until they are sent.
  const uint64_t window_bytes = transfer.window_bytes;
  absl::Mutex mu;
  struct Stream {
    size_t next = 0;     // the next piece to send
    uint64_t bytes = 0;  // bytes in flight
  } pushes, pulls;
  int pending = 0;
  absl::Status first_error;
  if (push == nullptr) pushes.next = pieces.size();  // pulls only
  // Starts the calls the windows allow; every finished call makes room.
  std::function<void()> start_more;
  auto finish = [&](Stream* stream, uint64_t bytes, absl::Status s) {
    absl::MutexLock lock(&mu);
    if (!s.ok() && first_error.ok()) {
      first_error = s;
      // No point waiting for pulls of a step that cannot complete.
      for (auto& c : calls) {
        c->push_context.TryCancel();
        c->pull_context.TryCancel();
      }
    }
    stream->bytes -= bytes;
    --pending;
    start_more();
  };
  const size_t num_pieces = pieces.size();
  // The index of `stream`'s next piece, then counted in flight, while no call
  // failed and its window has room for it.
  auto take = [&](Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) -> std::optional<size_t> {
    if (!first_error.ok() || stream.next == num_pieces) return std::nullopt;
    const uint64_t bytes = pieces[stream.next].n * esize_;
    if (stream.bytes > 0 && stream.bytes + bytes > window_bytes) return std::nullopt;
    stream.bytes += bytes;
    ++pending;
    return stream.next++;
  };
  start_more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (std::optional<size_t> i = take(pushes)) {
      const Piece& piece = pieces[*i];
      Call* c = calls[*i].get();
      const uint64_t bytes = piece.n * esize_;
      c->push_request.set_job_id(job_id_);
      c->push_request.set_step(step);
      c->push_request.set_generation(transfer.generation);
      c->push_request.set_flat_begin(piece.begin);
      c->push_request.set_num_params(piece.n);
      c->push_request.set_dtype(DTypeToProto(dtype_));
      c->push_request.set_coef(push->coef);
      *c->push_request.mutable_loss_scale_after() = push->loss_scale_after;
      if (push->lr.has_value()) c->push_request.set_lr(*push->lr);
      c->push_request.set_grads(transfer.grads + piece.begin * esize_, bytes);
      SetDeadline(&c->push_context, transfer.timeout);
      c->push_context.set_wait_for_ready(true);  // a restarting server is waited for
      piece.stub->async()->Push(&c->push_context, &c->push_request, &c->push_response,
                                [&finish, &piece, &pushes, bytes](grpc::Status s) {
                                  finish(&pushes, bytes,
                                         WithShardAddress(FromGrpcStatus(s), piece.address));
                                });
    }
    while (std::optional<size_t> i = take(pulls)) {
      const Piece& piece = pieces[*i];
      Call* c = calls[*i].get();
      const uint64_t bytes = piece.n * esize_;
      c->pull_request.set_job_id(job_id_);
      c->pull_request.set_step(step);
      c->pull_request.set_flat_begin(piece.begin);
      c->pull_request.set_num_params(piece.n);
      SetDeadline(&c->pull_context, transfer.timeout);
      c->pull_context.set_wait_for_ready(true);
      piece.stub->async()->Pull(
          &c->pull_context, &c->pull_request, &c->pull_response,
          [this, &transfer, &finish, &piece, &pulls, c, step, bytes](grpc::Status grpc_status) {
            absl::Status s = FromGrpcStatus(grpc_status);
            const std::string& got = c->pull_response.params();
            if (s.ok() && (got.size() != bytes || c->pull_response.step() != step)) {
              s = absl::InternalError(absl::StrCat("pull of [", piece.begin, ", +", piece.n,
                                                   ") returned ", got.size(), " bytes of step ",
                                                   c->pull_response.step()));
            }
            if (s.ok()) {
              std::memcpy(transfer.params + (piece.begin - transfer.params_base) * esize_,
                          got.data(), got.size());
            }
            finish(&pulls, bytes, WithShardAddress(s, piece.address));
          });
    }
  };
  absl::MutexLock lock(&mu);
  start_more();
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return pending == 0 &&
           (!first_error.ok() || (pushes.next == num_pieces && pulls.next == num_pieces));
  };
  mu.Await(absl::Condition(&done));
  absl::MutexLock inflight_lock(&inflight_mu_);
  inflight_.clear();
  return first_error;
}

}  // namespace strata
