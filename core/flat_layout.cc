#include "strata/flat_layout.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "core/round_up.h"

namespace strata {

absl::StatusOr<FlatLayout> FlatLayout::Create(std::vector<TensorSpec> tensors,
                                              uint64_t chunk_num_params) {
  if (tensors.empty()) return absl::InvalidArgumentError("a model needs at least one tensor");
  if (chunk_num_params == 0 || chunk_num_params % kTensorAlignmentParams != 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_num_params ", chunk_num_params,
                                                   " must be a positive multiple of ",
                                                   kTensorAlignmentParams));
  }
  FlatLayout layout;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", Quoted(t.name), " is used twice"));
    }
    if (t.shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(t.name), " has no dimensions"));
    }
    uint64_t count = 1;
    for (int64_t d : t.shape) {
      if (d <= 0 || d > (int64_t{1} << 40)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quoted(t.name), " has a dimension of ", d));
      }
      count *= static_cast<uint64_t>(d);
      if (count > (uint64_t{1} << 40)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(t.name), " is too large"));
      }
    }
    offset = RoundUp(offset, kTensorAlignmentParams);
    layout.tensor_ranges_.push_back({offset, offset + count});
    offset += count;
    if (offset > kMaxModelParams) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has more than ", kMaxModelParams, " parameters"));
    }
  }
  if ((offset + chunk_num_params - 1) / chunk_num_params > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_num_params ", chunk_num_params,
                                                   " cuts the model into more than ", UINT32_MAX,
                                                   " chunks"));
  }
  layout.tensors_ = std::move(tensors);
  layout.num_params_ = offset;
  layout.chunk_num_params_ = chunk_num_params;
  return layout;
}

uint32_t FlatLayout::num_chunks() const {
  return static_cast<uint32_t>((num_params_ + chunk_num_params_ - 1) / chunk_num_params_);
}

FlatRange FlatLayout::chunk_range(uint32_t chunk_id) const {
  uint64_t begin = uint64_t{chunk_id} * chunk_num_params_;
  return {begin, std::min(num_params_, begin + chunk_num_params_)};
}

std::vector<std::string> FlatLayout::TensorsIn(FlatRange range) const {
  std::vector<std::string> names;
  const auto [first, last] = TensorIndicesIn(range);
  for (size_t i = first; i < last; ++i) names.push_back(tensors_[i].name);
  return names;
}

std::pair<size_t, size_t> FlatLayout::TensorIndicesIn(FlatRange range) const {
  auto first = std::partition_point(tensor_ranges_.begin(), tensor_ranges_.end(),
                                    [&](const FlatRange& t) { return t.end <= range.begin; });
  auto last = std::partition_point(first, tensor_ranges_.end(),
                                   [&](const FlatRange& t) { return t.begin < range.end; });
  return {static_cast<size_t>(first - tensor_ranges_.begin()),
          static_cast<size_t>(last - tensor_ranges_.begin())};
}

std::vector<size_t> FlatLayout::SliceParts(FlatRange range, uint32_t world_size) const {
  std::vector<size_t> parts(world_size);
  for (uint32_t r = 0; r < world_size; ++r) {
    const FlatRange slice = WorkerSlice(r, world_size);
    const uint64_t begin = std::max(slice.begin, range.begin);
    const uint64_t end = std::min(slice.end, range.end);
    parts[r] = end > begin ? end - begin : 0;
  }
  return parts;
}

uint64_t FlatLayout::PaddedNumParams(uint32_t world_size) const {
  return RoundUp(num_params_, uint64_t{world_size} * kTensorAlignmentParams);
}

FlatRange FlatLayout::WorkerSlice(uint32_t rank, uint32_t world_size) const {
  uint64_t slice = PaddedNumParams(world_size) / world_size;
  uint64_t begin = std::min(num_params_, rank * slice);
  return {begin, std::min(num_params_, begin + slice)};
}

}  // namespace strata
