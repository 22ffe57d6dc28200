// GradientMemory: where a worker keeps one step's gradients, in the job's
// dtype over the padded flat space, on the worker's Device, and how many
// bytes they take.
//
// Whole (replicated parameters): one buffer of the padded flat space that
// every path works in place. On the host the slice is a window of it; on a
// GPU the slice is a buffer of pinned host memory of its own (what crosses
// to the shard servers), into which KeepReduced() copies the reduced part.
//
// Sharded (on-demand parameters, ZeRO-3): only this worker's slice of the
// reduced gradient stays between a step's buckets (the pushes read it), in
// (pinned) host memory. A streamed step's bucket gets a buffer of its own on
// the device when its first gradient comes and gives it back once
// reduce-scattered (its part copied into the slice), so that a worker holds
// its slice and the buckets in flight instead of the model's gradient.
// Micro-batches accumulated whole (AccumulateGradients) need the whole
// buffer: it is made at the first and dropped at the step's end; while it
// exists, buckets are windows of it.
//
// Errors are the device's (RESOURCE_EXHAUSTED when its memory runs out,
// UNAVAILABLE when a copy fails).
//
// Thread-safety: Bucket(), ReleaseBucket() and KeepReduced() from any
// thread (the caller's and the collective thread); everything else from the
// thread that drives the client, while no bucket's work runs.
#ifndef STRATA_CLIENT_GRADIENT_MEMORY_H_
#define STRATA_CLIENT_GRADIENT_MEMORY_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/buckets.h"
#include "client/device.h"
#include "strata/flat_layout.h"

namespace strata {

class GradientMemory {
 public:
  // `device` outlives the memory.
  GradientMemory(Device* device, bool sharded) : device_(device), sharded_(sharded) {}
  GradientMemory(const GradientMemory&) = delete;
  GradientMemory& operator=(const GradientMemory&) = delete;

  bool sharded() const { return sharded_; }

  // Takes a generation's space: `buckets` of the padded flat space, this
  // worker's `slice`, elements of `esize` bytes. The whole buffer, where
  // there is one, keeps its values at their flat positions (accumulated
  // micro-batches survive a re-forming); the slice starts at zero.
  absl::Status Reset(const Buckets& buckets, FlatRange slice, size_t esize);

  // The whole padded flat gradient on the device, flat index 0 at [0]: made
  // (zeros) on first use when sharded.
  absl::StatusOr<uint8_t*> Whole();
  bool has_whole() const { return !whole_.empty(); }

  // Bucket `i`'s gradient on the device, its first flat index at [0]: a
  // window of the whole buffer, or the bucket's own buffer (zeros when
  // made). Valid until ReleaseBucket(i) or Clear().
  absl::StatusOr<uint8_t*> Bucket(size_t i) ABSL_LOCKS_EXCLUDED(mu_);
  // Bucket `i` is reduce-scattered and its part is in the slice: its own
  // buffer goes.
  void ReleaseBucket(size_t i) ABSL_LOCKS_EXCLUDED(mu_);

  // The slice's gradient in host memory, flat index slice.begin at [0].
  uint8_t* Slice() {
    return separate_slice() ? slice_.data() : whole_.data() + slice_range_.begin * esize_;
  }
  // `part` (within the slice) is reduced at `reduced` (device memory):
  // into Slice(), unless Slice() is a window there.
  absl::Status KeepReduced(FlatRange part, const uint8_t* reduced);

  // Zeros for the next step; sharded, the whole and bucket buffers go.
  absl::Status Clear() ABSL_LOCKS_EXCLUDED(mu_);

  // The most bytes held at once since construction.
  uint64_t peak_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool separate_slice() const { return sharded_ || !device_->is_host(); }
  void Account(int64_t delta_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Device* const device_;
  const bool sharded_;
  Buckets buckets_{0, 1};
  FlatRange slice_range_;
  size_t esize_ = 1;
  DeviceMemory whole_;
  DeviceMemory slice_;  // host memory; where separate_slice()
  mutable absl::Mutex mu_;
  std::vector<DeviceMemory> own_ ABSL_GUARDED_BY(mu_);  // per bucket; sharded
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_CLIENT_GRADIENT_MEMORY_H_
