// GradientStream: one streamed step's gradients as backward completes them.
// The caller adds ranges of the last micro-batch's gradients; the buckets
// (client/buckets.h) go in reverse flat order, each once it and every bucket
// after it are complete -- the same order on every worker, whatever order
// the ranges come in. A bucket's work runs on the client's collective
// thread while the caller computes on: reduce-scatter over the workers
// (Collective::ReduceScatterSumV, segments cut by the workers' slices),
// statistics of this worker's part, and its pushes (PushStream). Sharded
// gradient memory (on-demand parameters) gives each bucket its buffer back
// once reduce-scattered, and Add() waits while more than
// kMaxBucketsQueued buckets are sent and not done: with ranges that come
// in backward's (reverse flat) order a worker then holds its slice and at
// most kMaxBucketsQueued + 2 buckets, however long a range.
//
// Thread-safety: Add() and Finish() from the thread that drives the client.
// The buckets' work runs on `thread` in the order sent, among the other
// collective work queued there (ParamGatherer's gathers).
#ifndef STRATA_CLIENT_GRADIENT_STREAM_H_
#define STRATA_CLIENT_GRADIENT_STREAM_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/buckets.h"
#include "client/collective.h"
#include "client/gradient_memory.h"
#include "client/push_stream.h"
#include "client/shard_transport.h"
#include "core/thread_pool.h"
#include "kernels/grad_stats.h"
#include "strata/flat_layout.h"

namespace strata {

class GradientStream {
 public:
  static constexpr int kMaxBucketsQueued = 2;

  struct Context {
    Collective* collective = nullptr;
    const FlatLayout* layout = nullptr;
    const ShardTransport* transport = nullptr;  // cuts the pushes into pieces
    DType dtype = DType::kFp32;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    Buckets buckets{0, 1};
    GradientMemory* grads = nullptr;  // the step's, micro-batches accumulated
    Device* device = nullptr;         // where `grads` and Add()'s gradients are
    ThreadPool* thread = nullptr;
    PushStream* pushes = nullptr;
  };

  // Everything in `context` outlives the stream.
  explicit GradientStream(Context context);
  // Waits for the buckets' work in flight.
  ~GradientStream();
  GradientStream(const GradientStream&) = delete;
  GradientStream& operator=(const GradientStream&) = delete;

  // Adds `grads` (range.size() FP32 values in the device's memory) times
  // `multiplier` to the gradient of `range`, then sends the buckets it
  // completes.
  // INVALID_ARGUMENT for a range outside the flat space, a span of another
  // size, a range that overlaps one added before, or an Add() after Finish().
  absl::Status Add(FlatRange range, absl::Span<const float> grads, float multiplier);
  // Sends the buckets not sent yet (complete or not) and waits for the work
  // of every bucket: this worker's statistics per bucket, or the first
  // error of a reduce-scatter. Push errors are the PushStream's.
  absl::StatusOr<std::vector<GradStats>> Finish();
  // Waits for the work of the buckets sent so far (the caller is about to
  // use the collective itself).
  void WaitIdle();

 private:
  // Sends every bucket from next_ - 1 down that is complete (all: `all`).
  void SendReady(bool all);
  // A bucket's work, on the collective thread.
  absl::Status Reduce(size_t bucket);

  const Context context_;
  const FlatRange slice_;
  std::vector<uint64_t> missing_;       // per bucket: tensor parameters not added yet
  std::map<uint64_t, uint64_t> added_;  // ranges added: begin -> end
  size_t next_;                         // buckets [next_, size) are sent
  bool finished_ = false;
  std::vector<GradStats> stats_;  // per bucket; each written by its work
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // buckets sent and not done
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_CLIENT_GRADIENT_STREAM_H_
