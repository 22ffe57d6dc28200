#include "client/gradient_stream.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rpc/grpc_util.h"

namespace strata {
namespace {

// The tensor parameters of `range` (its padding excluded).
uint64_t TensorParamsIn(const FlatLayout& layout, FlatRange range) {
  uint64_t n = 0;
  const auto [first, last] = layout.TensorIndicesIn(range);
  for (size_t i = first; i < last; ++i) n += Intersect(layout.tensor_range(i), range).size();
  return n;
}

}  // namespace

GradientStream::GradientStream(Context context)
    : context_(std::move(context)),
      slice_(context_.layout->WorkerSlice(context_.rank, context_.world_size)),
      next_(context_.buckets.size()),
      stats_(context_.buckets.size()) {
  missing_.resize(context_.buckets.size());
  for (size_t i = 0; i < missing_.size(); ++i) {
    missing_[i] = TensorParamsIn(*context_.layout, context_.buckets.bucket(i));
  }
}

GradientStream::~GradientStream() { WaitIdle(); }

void GradientStream::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
}

absl::Status GradientStream::Add(FlatRange range, absl::Span<const float> grads, float multiplier) {
  if (finished_) return absl::InvalidArgumentError("gradients added after the step's end");
  if (range.begin > range.end || range.end > context_.layout->num_params()) {
    return absl::InvalidArgumentError(absl::StrCat("gradients of [", range.begin, ", ", range.end,
                                                   "): the flat space is [0, ",
                                                   context_.layout->num_params(), ")"));
  }
  if (grads.size() != range.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradients of ", range.size(), " parameters given as ", grads.size(), " floats"));
  }
  if (range.empty()) return absl::OkStatus();
  auto next = added_.lower_bound(range.begin);
  if ((next != added_.end() && next->first < range.end) ||
      (next != added_.begin() && std::prev(next)->second > range.begin)) {
    return absl::InvalidArgumentError(absl::StrCat("gradients of [", range.begin, ", ", range.end,
                                                   ") overlap a range given for this step"));
  }
  added_.emplace(range.begin, range.end);
  // Bucket by bucket from the range's end (backward's order), each sent as
  // soon as it is complete.
  const Buckets& buckets = context_.buckets;
  const size_t esize = DTypeSize(context_.dtype);
  for (size_t i = buckets.BucketOf(range.end - 1) + 1; i-- > buckets.BucketOf(range.begin);) {
    if (context_.grads->sharded()) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](int* pending) { return *pending <= kMaxBucketsQueued; }, &pending_));
    }
    const FlatRange bucket = buckets.bucket(i);
    const FlatRange part = Intersect(bucket, range);
    ASSIGN_OR_RETURN(uint8_t * acc, context_.grads->Bucket(i));
    RETURN_IF_ERROR(context_.device->AccumulateScaled(
        context_.dtype, grads.data() + (part.begin - range.begin), multiplier,
        acc + (part.begin - bucket.begin) * esize, part.size()));
    missing_[i] -= TensorParamsIn(*context_.layout, part);
    SendReady(/*all=*/false);
  }
  return absl::OkStatus();
}

void GradientStream::SendReady(bool all) {
  while (next_ > 0 && (all || missing_[next_ - 1] == 0)) {
    const size_t bucket = --next_;
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    context_.thread->Schedule([this, bucket] {
      absl::Status s = Reduce(bucket);
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
      --pending_;
    });
  }
}

absl::Status GradientStream::Reduce(size_t bucket) {
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return absl::OkStatus();  // the step failed already
  }
  const FlatRange range = context_.buckets.bucket(bucket);
  const size_t esize = DTypeSize(context_.dtype);
  GradientMemory& memory = *context_.grads;
  ASSIGN_OR_RETURN(uint8_t * grads, memory.Bucket(bucket));
  RETURN_IF_ERROR(context_.collective->ReduceScatterSumV(
      context_.dtype, grads, context_.layout->SliceParts(range, context_.world_size)));
  const FlatRange mine = Intersect(range, slice_);
  if (mine.empty()) {
    memory.ReleaseBucket(bucket);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(memory.KeepReduced(mine, grads + (mine.begin - range.begin) * esize));
  memory.ReleaseBucket(bucket);
  const uint8_t* slice_grads = memory.Slice() + (mine.begin - slice_.begin) * esize;
  stats_[bucket] = ComputeGradStats(context_.dtype, slice_grads, mine.size());
  for (const Piece& piece : context_.transport->PiecesOf(mine, kMaxPayloadBytes / esize)) {
    context_.pushes->Send(piece, memory.Slice() + (piece.begin - slice_.begin) * esize);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GradStats>> GradientStream::Finish() {
  finished_ = true;
  SendReady(/*all=*/true);
  WaitIdle();
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(error_);
  return stats_;
}

}  // namespace strata
