#include "client/param_gatherer.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/notification.h"
#include "core/status_macros.h"

namespace strata {

struct ParamGatherer::Result {
  absl::Notification done;
  absl::Status status;  // set before done
};

class ParamGatherer::Pending : public PendingGather {
 public:
  explicit Pending(std::shared_ptr<Result> result) : result_(std::move(result)) {}
  ~Pending() override { result_->done.WaitForNotification(); }
  absl::Status Wait() override {
    result_->done.WaitForNotification();
    return result_->status;
  }

 private:
  std::shared_ptr<Result> result_;
};

std::unique_ptr<PendingGather> ParamGatherer::Start(const Source& source, FlatRange range,
                                                    absl::Span<float> out) {
  auto result = std::make_shared<Result>();
  last_ = result;
  thread_->Schedule([this, source, range, out, result] {
    result->status = Gather(source, range, out);
    if (!result->status.ok()) {
      absl::MutexLock lock(&mu_);
      if (first_error_.ok()) first_error_ = result->status;
    }
    result->done.Notify();
  });
  return std::make_unique<Pending>(std::move(result));
}

std::unique_ptr<PendingGather> ParamGatherer::Done(absl::Status status) {
  auto result = std::make_shared<Result>();
  result->status = std::move(status);
  result->done.Notify();
  return std::make_unique<Pending>(std::move(result));
}

absl::Status ParamGatherer::Drain() {
  if (last_ != nullptr) last_->done.WaitForNotification();
  last_.reset();
  absl::MutexLock lock(&mu_);
  return std::exchange(first_error_, absl::OkStatus());
}

absl::Status ParamGatherer::Gather(const Source& source, FlatRange range, absl::Span<float> out) {
  const size_t esize = DTypeSize(source.dtype);
  // Slices are contiguous in rank order, so the ranks' pieces of `range`,
  // concatenated in rank order, are the range.
  const std::vector<size_t> counts = source.layout->SliceParts(range, source.world_size);
  const uint8_t* input = source.slice_bytes;
  if (counts[source.rank] > 0) {
    input += (std::max(source.slice.begin, range.begin) - source.slice.begin) * esize;
  }
  if (source.dtype == DType::kFp32) {  // straight into the caller's floats
    return source.collective->AllGatherV(source.dtype, input, out.data(), counts);
  }
  RETURN_IF_ERROR(GrowScratch(*source.device, range.size() * esize, &scratch_));
  RETURN_IF_ERROR(source.collective->AllGatherV(source.dtype, input, scratch_.data(), counts));
  return source.device->CastToFloat(source.dtype, scratch_.data(), out.data(), out.size());
}

}  // namespace strata
