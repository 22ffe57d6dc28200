// ChunkGroups: how a job's parameter groups (JobSpec.groups, torch's
// param_groups) cut one chunk: spans of the chunk in flat order, each updated
// with its group's weight decay and, where a step gives one per group, its
// group's learning rate. A job without groups has one span, updated with the
// job's own weight decay. Immutable; safe to share between threads.
#ifndef STRATA_SHARD_CHUNK_GROUPS_H_
#define STRATA_SHARD_CHUNK_GROUPS_H_

#include <cstdint>
#include <vector>

#include "kernels/adam.h"
#include "strata/flat_layout.h"
#include "strata/types.h"
#include "strata/v1/common.pb.h"

namespace strata {

// A range of a chunk (offsets from its start) and the constants it is
// updated with.
struct ConstantsSpan {
  uint64_t offset = 0;
  uint64_t n = 0;
  AdamConstants constants;
};

struct ChunkGroups {
  struct Span {
    uint64_t offset = 0;
    uint64_t n = 0;
    uint32_t group = 0;
  };
  // Per group; empty: one group, with the job's AdamConfig.weight_decay.
  std::vector<float> weight_decay;
  // Cover the chunk in order; empty: one span of group 0.
  std::vector<Span> spans;

  uint32_t num_groups() const {
    return weight_decay.empty() ? 1 : static_cast<uint32_t>(weight_decay.size());
  }
};

// The groups of `chunk` of a job (`spec`, valid, laid out as `layout`):
// padding between tensors goes with the tensor after it, padding after the
// last tensor with that one.
ChunkGroups ChunkGroupsOf(const v1::JobSpec& spec, const FlatLayout& layout, FlatRange chunk);

// The constants of each span of a chunk of `num_params` at `step`: `adam`
// with each group's weight decay and learning rate (`group_lrs[g]`, or `lr`
// for all when empty), and `coef`.
std::vector<ConstantsSpan> SpanConstants(const ChunkGroups& groups, uint64_t num_params,
                                         const AdamConfig& adam, float lr,
                                         const std::vector<float>& group_lrs, int64_t step,
                                         float coef);

}  // namespace strata

#endif  // STRATA_SHARD_CHUNK_GROUPS_H_
