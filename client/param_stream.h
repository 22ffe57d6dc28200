// ParamStream: a replicated step's all-gather, bucket by bucket in flat
// order on the client's collective thread, so that Step() returns once this
// worker's slice is pulled and the next forward waits only for the buckets
// of the ranges it reads (per-layer readiness). Each bucket is one
// AllGatherV of the workers' parts of it (their slices are contiguous in
// rank order), in place in the whole-model parameter buffer, on the
// worker's device.
//
// Thread-safety: WaitFor() and WaitAll() from any thread; the buckets' work
// runs on the collective thread. Until WaitAll() has returned, nobody else
// may use the collective or write the parameter buffer.
#ifndef STRATA_CLIENT_PARAM_STREAM_H_
#define STRATA_CLIENT_PARAM_STREAM_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "client/buckets.h"
#include "client/collective.h"
#include "client/device.h"
#include "core/thread_pool.h"
#include "strata/flat_layout.h"

namespace strata {

class ParamStream {
 public:
  struct Context {
    Collective* collective = nullptr;
    const FlatLayout* layout = nullptr;
    DType dtype = DType::kFp32;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    Buckets buckets{0, 1};
    uint8_t* params = nullptr;  // the padded flat parameters; this worker's slice pulled
    Device* device = nullptr;   // where `params` are
    // This worker's part of a bucket, grown as needed; kept from step to step
    // (device memory is slow to allocate) by the caller, who uses it only
    // while no stream runs.
    DeviceMemory* scratch = nullptr;
    ThreadPool* thread = nullptr;
  };

  // Queues every bucket's all-gather; everything in `context` outlives the
  // stream.
  explicit ParamStream(Context context);
  // Waits for the buckets' work.
  ~ParamStream();
  ParamStream(const ParamStream&) = delete;
  ParamStream& operator=(const ParamStream&) = delete;

  // Waits until the parameters of `range` are gathered: OK, or the error
  // that ended the all-gather before it got there (a lost worker).
  absl::Status WaitFor(FlatRange range) const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for every bucket: OK, or the all-gather's error.
  absl::Status WaitAll() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Bucket `i`'s all-gather, on the collective thread.
  absl::Status Gather(size_t i);

  const Context context_;
  const FlatRange slice_;
  mutable absl::Mutex mu_;
  uint64_t gathered_end_ ABSL_GUARDED_BY(mu_) = 0;  // [0, gathered_end_) is gathered
  size_t pending_ ABSL_GUARDED_BY(mu_);             // buckets not done
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_CLIENT_PARAM_STREAM_H_
