// GradientMemory: where a worker keeps one step's gradients, in the job's
// dtype over the padded flat space, and how many bytes they take.
//
// Whole (replicated parameters): one buffer of the padded flat space that
// every path works in place; the slice is a window of it.
//
// Sharded (on-demand parameters, ZeRO-3): only this worker's slice of the
// reduced gradient stays between a step's buckets (the pushes read it).
// A streamed step's bucket gets a buffer of its own when its first gradient
// comes and gives it back once reduce-scattered (its part copied into the
// slice), so that a worker holds its slice and the buckets in flight
// instead of the model's gradient. Micro-batches accumulated whole
// (AccumulateGradients) need the whole buffer: it is made at the first and
// dropped at the step's end; while it exists, buckets are windows of it.
//
// Thread-safety: Bucket() and ReleaseBucket() from any thread (the caller's
// and the collective thread); everything else from the thread that drives
// the client, while no bucket's work runs.
#ifndef STRATA_CLIENT_GRADIENT_MEMORY_H_
#define STRATA_CLIENT_GRADIENT_MEMORY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/buckets.h"
#include "strata/flat_layout.h"

namespace strata {

class GradientMemory {
 public:
  explicit GradientMemory(bool sharded) : sharded_(sharded) {}
  GradientMemory(const GradientMemory&) = delete;
  GradientMemory& operator=(const GradientMemory&) = delete;

  bool sharded() const { return sharded_; }

  // Takes a generation's space: `buckets` of the padded flat space, this
  // worker's `slice`, elements of `esize` bytes. The whole buffer, where
  // there is one, keeps its values at their flat positions (accumulated
  // micro-batches survive a re-forming); the slice starts at zero.
  void Reset(const Buckets& buckets, FlatRange slice, size_t esize);

  // The whole padded flat gradient, flat index 0 at [0]: made (zeros) on
  // first use when sharded.
  uint8_t* Whole();
  bool has_whole() const { return !whole_.empty(); }

  // Bucket `i`'s gradient, its first flat index at [0]: a window of the
  // whole buffer, or the bucket's own buffer (zeros when made). Valid until
  // ReleaseBucket(i) or Clear().
  uint8_t* Bucket(size_t i) ABSL_LOCKS_EXCLUDED(mu_);
  // Bucket `i` is reduce-scattered and its part is in the slice: its own
  // buffer goes.
  void ReleaseBucket(size_t i) ABSL_LOCKS_EXCLUDED(mu_);

  // The slice's gradient, flat index slice.begin at [0].
  uint8_t* Slice() {
    return sharded_ ? slice_.data() : whole_.data() + slice_range_.begin * esize_;
  }

  // Zeros for the next step; sharded, the whole and bucket buffers go.
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // The most bytes held at once since construction.
  uint64_t peak_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Account(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool sharded_;
  Buckets buckets_{0, 1};
  FlatRange slice_range_;
  size_t esize_ = 1;
  std::vector<uint8_t> whole_;
  std::vector<uint8_t> slice_;  // sharded only
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<uint8_t[]>> own_ ABSL_GUARDED_BY(mu_);  // per bucket; sharded
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_CLIENT_GRADIENT_MEMORY_H_
