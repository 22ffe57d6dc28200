// ParamGatherer: gathers ranges of the flat parameter space from the slices
// the workers hold (on-demand parameters, ParamResidency::kOnDemand) on one
// background thread, in the order they were started, so that the trainer
// computes while the next range arrives. Each gather is one AllGatherV of
// the range's pieces in the workers' slices, then a cast to FP32. The thread
// is the client's collective thread, shared with the streamed step's buckets.
//
// Thread-safety: Start() and Drain() are called by the thread that drives
// the client. Between a Start() and the Drain() after it, nobody else may use
// the collective or change the slice's bytes that the gather reads.
#ifndef STRATA_CLIENT_PARAM_GATHERER_H_
#define STRATA_CLIENT_PARAM_GATHERER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/collective.h"
#include "client/device.h"
#include "core/thread_pool.h"
#include "strata/client.h"

namespace strata {

class ParamGatherer {
 public:
  // Where the parameters are: this worker's `slice` (bytes in `dtype`) of
  // the flat space cut into `world_size` slices by `layout`.
  struct Source {
    Collective* collective = nullptr;
    const FlatLayout* layout = nullptr;
    DType dtype = DType::kFp32;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    FlatRange slice;
    const uint8_t* slice_bytes = nullptr;
    Device* device = nullptr;  // where `slice_bytes` and the gathers' output are
  };

  // Gathers run on `thread` (which outlives the gatherer), in the order
  // queued there with other work on the collective.
  explicit ParamGatherer(ThreadPool* thread) : thread_(thread) {}
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Queues the gather of `range` into `out` (range.size() floats in the
  // device's memory); `range` and `out` have been checked. `out` stays valid until the result's
  // Wait().
  std::unique_ptr<PendingGather> Start(const Source& source, FlatRange range,
                                       absl::Span<float> out);
  // A gather that finished at once with `status` (refused, or local).
  static std::unique_ptr<PendingGather> Done(absl::Status status);
  // Waits for every gather started so far and returns the first error any
  // of them met since the last Drain() (OK if none).
  absl::Status Drain();

 private:
  struct Result;
  class Pending;

  absl::Status Gather(const Source& source, FlatRange range, absl::Span<float> out);

  DeviceMemory scratch_;          // the gathered range in the job's dtype; gather thread only
  std::shared_ptr<Result> last_;  // the newest gather started
  absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  ThreadPool* const thread_;
};

}  // namespace strata

#endif  // STRATA_CLIENT_PARAM_GATHERER_H_
