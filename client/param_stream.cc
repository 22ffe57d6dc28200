#include "client/param_stream.h"

#include <utility>

#include "core/status_macros.h"

namespace strata {

ParamStream::ParamStream(Context context)
    : context_(std::move(context)),
      slice_(context_.layout->WorkerSlice(context_.rank, context_.world_size)),
      pending_(context_.buckets.size()) {
  for (size_t i = 0; i < context_.buckets.size(); ++i) {
    context_.thread->Schedule([this, i] {
      bool failed;
      {
        absl::MutexLock lock(&mu_);
        failed = !error_.ok();
      }
      absl::Status s = failed ? absl::OkStatus() : Gather(i);
      absl::MutexLock lock(&mu_);
      if (error_.ok() && !s.ok()) error_ = s;
      if (error_.ok()) gathered_end_ = context_.buckets.bucket(i).end;
      --pending_;
    });
  }
}

ParamStream::~ParamStream() { WaitAll().IgnoreError(); }

absl::Status ParamStream::Gather(size_t i) {
  const FlatRange bucket = context_.buckets.bucket(i);
  const size_t esize = DTypeSize(context_.dtype);
  const FlatRange mine = Intersect(bucket, slice_);
  // AllGatherV's input and output do not overlap: this worker's part goes
  // through a copy.
  RETURN_IF_ERROR(GrowScratch(*context_.device, mine.size() * esize, context_.scratch));
  RETURN_IF_ERROR(context_.device->Copy(context_.scratch->data(),
                                        context_.params + mine.begin * esize, mine.size() * esize));
  return context_.collective->AllGatherV(context_.dtype, context_.scratch->data(),
                                         context_.params + bucket.begin * esize,
                                         context_.layout->SliceParts(bucket, context_.world_size));
}

absl::Status ParamStream::WaitFor(FlatRange range) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this, range]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !error_.ok() || pending_ == 0 || gathered_end_ >= range.end;
  };
  mu_.Await(absl::Condition(&ready));
  return gathered_end_ >= range.end ? absl::OkStatus() : error_;
}

absl::Status ParamStream::WaitAll() const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&done));
  return error_;
}

}  // namespace strata
