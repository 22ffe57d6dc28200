// FlatLayout: where each tensor of a model lives in the flat parameter space,
// and how that space is cut into chunks (fixed ranges, the unit of placement)
// and into worker slices (the cut that reduce-scatter leaves each worker).
// Immutable after Create(); safe to share between threads.
#ifndef STRATA_FLAT_LAYOUT_H_
#define STRATA_FLAT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/types.h"

namespace strata {

// Every tensor starts at a multiple of this many elements.
inline constexpr uint64_t kTensorAlignmentParams = 64;
// The largest flat space, padding included (17.6 trillion parameters): every
// sum and product of offsets below it fits 64 bits with room to spare.
inline constexpr uint64_t kMaxModelParams = uint64_t{1} << 44;

struct FlatRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  uint64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

class FlatLayout {
 public:
  // INVALID_ARGUMENT for no tensors, empty or duplicate names, non-positive
  // dimensions, more than kMaxModelParams in all, a chunk size that is zero
  // or not a multiple of 64, or more than 2^32 - 1 chunks.
  static absl::StatusOr<FlatLayout> Create(std::vector<TensorSpec> tensors,
                                           uint64_t chunk_num_params);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The flat range of tensor `i` (its elements; padding follows it).
  FlatRange tensor_range(size_t i) const { return tensor_ranges_[i]; }
  // Size of the flat space, padding between tensors included.
  uint64_t num_params() const { return num_params_; }
  uint64_t chunk_num_params() const { return chunk_num_params_; }
  uint32_t num_chunks() const;
  FlatRange chunk_range(uint32_t chunk_id) const;
  // Names of the tensors that overlap `range`.
  std::vector<std::string> TensorsIn(FlatRange range) const;
  // Indices [first, last) of the tensors that overlap `range` (tensors lie in
  // flat order), found in O(log tensors).
  std::pair<size_t, size_t> TensorIndicesIn(FlatRange range) const;
  // Slice `rank` of `world_size` equal slices of a buffer of
  // PaddedNumParams(world_size) elements, clipped to the flat space.
  FlatRange WorkerSlice(uint32_t rank, uint32_t world_size) const;
  // How many parameters of `range` lie in each of the `world_size` workers'
  // slices, in rank order (the counts of a collective over the range).
  std::vector<size_t> SliceParts(FlatRange range, uint32_t world_size) const;
  // Buffer size that cuts into `world_size` equal slices, each a multiple of 64.
  uint64_t PaddedNumParams(uint32_t world_size) const;

 private:
  FlatLayout() = default;
  std::vector<TensorSpec> tensors_;
  std::vector<FlatRange> tensor_ranges_;
  uint64_t num_params_ = 0;
  uint64_t chunk_num_params_ = 0;
};

}  // namespace strata

#endif  // STRATA_FLAT_LAYOUT_H_
