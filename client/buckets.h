// Buckets: the streamed step's cut of a padded flat space into contiguous
// ranges of `bucket_num_params` (the last one shorter), and the gradient
// statistics per bucket that both kinds of step sum in the same order, so
// that a streamed step and an unstreamed one give the same bits.
// Immutable; safe to share between threads.
#ifndef STRATA_CLIENT_BUCKETS_H_
#define STRATA_CLIENT_BUCKETS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/grad_stats.h"
#include "strata/flat_layout.h"
#include "strata/types.h"

namespace strata {

class Buckets {
 public:
  // `bucket_num_params` > 0.
  Buckets(uint64_t padded_num_params, uint64_t bucket_num_params)
      : padded_num_params_(padded_num_params), bucket_num_params_(bucket_num_params) {}

  uint64_t padded_num_params() const { return padded_num_params_; }
  size_t size() const {
    return static_cast<size_t>((padded_num_params_ + bucket_num_params_ - 1) / bucket_num_params_);
  }
  FlatRange bucket(size_t i) const {
    const uint64_t begin = i * bucket_num_params_;
    return {begin, std::min(padded_num_params_, begin + bucket_num_params_)};
  }
  // Which bucket holds flat index `index`.
  size_t BucketOf(uint64_t index) const { return static_cast<size_t>(index / bucket_num_params_); }

 private:
  uint64_t padded_num_params_;
  uint64_t bucket_num_params_;
};

inline FlatRange Intersect(FlatRange a, FlatRange b) {
  FlatRange r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  return r.empty() ? FlatRange{} : r;
}

// The statistics of `slice_grads` (in `dtype`, flat index slice.begin at
// [0]), taken per bucket.
inline std::vector<GradStats> SliceGradStats(const Buckets& buckets, FlatRange slice, DType dtype,
                                             const uint8_t* slice_grads) {
  std::vector<GradStats> stats(buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    FlatRange part = Intersect(buckets.bucket(i), slice);
    if (part.empty()) continue;
    stats[i] = ComputeGradStats(dtype, slice_grads + (part.begin - slice.begin) * DTypeSize(dtype),
                                part.size());
  }
  return stats;
}

// Per-bucket statistics summed in bucket order.
inline GradStats SumGradStats(const std::vector<GradStats>& per_bucket) {
  GradStats total;
  for (const GradStats& s : per_bucket) {
    total.sum_squares += s.sum_squares;
    total.all_finite = total.all_finite && s.all_finite;
  }
  return total;
}

}  // namespace strata

#endif  // STRATA_CLIENT_BUCKETS_H_
