#include "shard/chunk_groups.h"

#include <algorithm>

namespace strata {

ChunkGroups ChunkGroupsOf(const v1::JobSpec& spec, const FlatLayout& layout, FlatRange chunk) {
  ChunkGroups groups;
  if (spec.groups_size() == 0) return groups;
  for (const v1::ParamGroup& g : spec.groups()) groups.weight_decay.push_back(g.weight_decay());
  // Each tensor's span runs from the end of the one before (its padding
  // included) to its own end; padding at the chunk's end goes with the
  // tensor after it, or the chunk's last when none follows.
  uint64_t covered = chunk.begin;
  auto extend = [&](uint64_t end, uint32_t group) {
    if (!groups.spans.empty() && groups.spans.back().group == group) {
      groups.spans.back().n += end - covered;
    } else {
      groups.spans.push_back({covered - chunk.begin, end - covered, group});
    }
    covered = end;
  };
  const auto [first, last] = layout.TensorIndicesIn(chunk);
  for (size_t i = first; i < last; ++i) {
    extend(std::min(layout.tensor_range(i).end, chunk.end),
           spec.tensors(static_cast<int>(i)).group());
  }
  if (covered < chunk.end) {
    const bool next = last < layout.tensors().size();
    extend(chunk.end, next                   ? spec.tensors(static_cast<int>(last)).group()
                      : groups.spans.empty() ? 0
                                             : groups.spans.back().group);
  }
  return groups;
}

std::vector<ConstantsSpan> SpanConstants(const ChunkGroups& groups, uint64_t num_params,
                                         const AdamConfig& adam, float lr,
                                         const std::vector<float>& group_lrs, int64_t step,
                                         float coef) {
  std::vector<AdamConstants> per_group(groups.num_groups());
  for (uint32_t g = 0; g < per_group.size(); ++g) {
    AdamConfig config = adam;
    config.lr = group_lrs.empty() ? lr : group_lrs[g];
    if (!groups.weight_decay.empty()) config.weight_decay = groups.weight_decay[g];
    per_group[g] = MakeAdamConstants(config, step, coef);
  }
  if (groups.spans.empty()) return {ConstantsSpan{0, num_params, per_group[0]}};
  std::vector<ConstantsSpan> spans;
  for (const ChunkGroups::Span& s : groups.spans) {
    spans.push_back(ConstantsSpan{s.offset, s.n, per_group[s.group]});
  }
  return spans;
}

}  // namespace strata
