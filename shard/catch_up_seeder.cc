#include "shard/catch_up_seeder.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

// Runs `each(i)` for every piece of `copy` (InSeedStreams).
absl::Status ForEachPiece(const CatchUpCopy& copy,
                          const std::function<absl::Status(size_t)>& each) {
  return InSeedStreams(copy.pieces().size(), each);
}

v1::ReadStepLogRequest LogRequest(const SeedSource& source, const CatchUpCopy& copy,
                                  const CatchUpCopy::Piece& piece) {
  v1::ReadStepLogRequest request;
  request.set_job_id(source.job_id);
  request.set_flat_begin(copy.chunk().flat_begin() + piece.offset);
  request.set_num_params(piece.n);
  return request;
}

}  // namespace

absl::Status ReadPieces(const SeedSource& source, CatchUpCopy* copy) {
  v1::ReadStepLogRequest start = LogRequest(source, *copy, copy->pieces()[0]);
  start.set_start(true);
  v1::ReadStepLogResponse started;
  RETURN_IF_ERROR(AtSource(CallUnary(source.stub.get(), &v1::ShardServer::Stub::ReadStepLog, start,
                                     &started, source.call_timeout),
                           source.address));
  return ForEachPiece(*copy, [&](size_t i) {
    const CatchUpCopy::Piece& piece = copy->pieces()[i];
    // Straight into the copy; a piece that fails leaves the copy unusable.
    ASSIGN_OR_RETURN(const int64_t step,
                     ReadStoredState(source, copy->chunk().flat_begin() + piece.offset, piece.n,
                                     copy->PieceSpans(i)));
    if (step < started.since_step()) {
      return AtSource(absl::AbortedError(absl::StrCat("read step ", step, " before its log's step ",
                                                      started.since_step())),
                      source.address);
    }
    copy->PieceRead(i, step);
    return absl::OkStatus();
  });
}

absl::StatusOr<uint64_t> CatchUp(const SeedSource& source, CatchUpCopy* copy,
                                 bool to_applied_step) {
  const int64_t release_through = copy->min_step();
  std::atomic<uint64_t> replayed{0};
  RETURN_IF_ERROR(ForEachPiece(*copy, [&](size_t i) -> absl::Status {
    while (true) {
      const CatchUpCopy::Piece& piece = copy->pieces()[i];
      v1::ReadStepLogRequest read = LogRequest(source, *copy, piece);
      read.set_after_step(piece.step);
      read.set_release_through(release_through);
      v1::ReadStepLogResponse log;
      RETURN_IF_ERROR(AtSource(CallUnary(source.stub.get(), &v1::ShardServer::Stub::ReadStepLog,
                                         read, &log, source.call_timeout),
                               source.address));
      for (const v1::LoggedStep& step : log.steps()) {
        if (step.step() != piece.step + 1) {
          return AtSource(absl::AbortedError(absl::StrCat(
                              "the step log of chunk ", copy->chunk().chunk_id(), " gives step ",
                              step.step(), " after step ", piece.step, ": it began anew")),
                          source.address);
        }
        const std::vector<float> group_lrs(step.group_lrs().begin(), step.group_lrs().end());
        RETURN_IF_ERROR(
            AtSource(copy->Replay(i, step.step(), step.coef(), step.lr(), group_lrs, step.grads()),
                     source.address));
        ++replayed;
      }
      if (!to_applied_step || piece.step == log.applied_step()) return absl::OkStatus();
      if (log.steps().empty()) {
        return AtSource(absl::AbortedError(absl::StrCat(
                            "chunk ", copy->chunk().chunk_id(), " is at step ", log.applied_step(),
                            "; its step log ends at step ", piece.step)),
                        source.address);
      }
    }
  }));
  return replayed.load() / copy->pieces().size();
}

absl::Status PullPrevious(const SeedSource& source, CatchUpCopy* copy) {
  return ForEachPiece(*copy, [&](size_t i) -> absl::Status {
    const CatchUpCopy::Piece& piece = copy->pieces()[i];
    if (piece.previous || piece.step < 1) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::optional<std::string> before,
                     PullCopyAt(source, piece.step - 1, copy->chunk().flat_begin() + piece.offset,
                                piece.n, copy->dtype()));
    if (!before.has_value()) return absl::OkStatus();
    std::memcpy(copy->previous(i), before->data(), before->size());
    copy->SetPrevious(i);
    return absl::OkStatus();
  });
}

void EndStepLog(const SeedSource& source, const CatchUpCopy& copy) {
  v1::ReadStepLogRequest end = LogRequest(source, copy, copy.pieces()[0]);
  end.set_end(true);
  v1::ReadStepLogResponse ignored;
  CallUnary(source.stub.get(), &v1::ShardServer::Stub::ReadStepLog, end, &ignored,
            source.call_timeout)
      .IgnoreError();
}

}  // namespace strata
