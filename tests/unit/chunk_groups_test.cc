// Parameter groups on the server: a job spec's groups are checked, and
// ChunkGroupsOf() cuts chunks by their tensors' groups, padding included.
#include "shard/chunk_groups.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

// Tensors of 100, 30 and 70 parameters (at 0, 128 and 192: padding after
// the first two), in groups 0, 1, 1; chunks of 128.
v1::JobSpec GroupedSpec() {
  v1::JobSpec spec;
  spec.set_job_id("groups");
  spec.set_world_size(1);
  spec.set_chunk_num_params(128);
  spec.set_dtype(v1::DTYPE_FP32);
  spec.mutable_adam()->set_lr(1e-3f);
  spec.mutable_adam()->set_eps(1e-8f);
  const int sizes[] = {100, 30, 70};
  const int groups[] = {0, 1, 1};
  for (int i = 0; i < 3; ++i) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->add_shape(sizes[i]);
    t->set_group(groups[i]);
  }
  spec.add_groups()->set_weight_decay(0.1f);
  spec.add_groups()->set_weight_decay(0.0f);
  return spec;
}

TEST(ChunkGroupsTest, ChunksAreCutByTheirTensorsGroups) {
  const v1::JobSpec spec = GroupedSpec();
  auto layout = ValidateJobSpec(spec);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->num_chunks(), 3u);  // [0, 128), [128, 256), [256, 262)
  // Chunk 0: t0 (group 0), then the padding before t1 (group 1, as t1).
  ChunkGroups c0 = ChunkGroupsOf(spec, *layout, layout->chunk_range(0));
  EXPECT_EQ(c0.weight_decay, (std::vector<float>{0.1f, 0.0f}));
  ASSERT_EQ(c0.spans.size(), 2u);
  EXPECT_EQ(c0.spans[0].offset, 0u);
  EXPECT_EQ(c0.spans[0].n, 100u);
  EXPECT_EQ(c0.spans[0].group, 0u);
  EXPECT_EQ(c0.spans[1].offset, 100u);
  EXPECT_EQ(c0.spans[1].n, 28u);
  EXPECT_EQ(c0.spans[1].group, 1u);
  // Chunk 1: t1, its padding and the start of t2, all group 1: one span.
  ChunkGroups c1 = ChunkGroupsOf(spec, *layout, layout->chunk_range(1));
  ASSERT_EQ(c1.spans.size(), 1u);
  EXPECT_EQ(c1.spans[0].n, 128u);
  EXPECT_EQ(c1.spans[0].group, 1u);
  // Groups 0 then 1 within one chunk, when chunks are larger.
  v1::JobSpec wide = spec;
  wide.set_chunk_num_params(256);
  auto wide_layout = ValidateJobSpec(wide);
  ASSERT_TRUE(wide_layout.ok());
  ChunkGroups w0 = ChunkGroupsOf(wide, *wide_layout, wide_layout->chunk_range(0));
  ASSERT_EQ(w0.spans.size(), 2u);
  EXPECT_EQ(w0.spans[0].n, 100u);       // t0
  EXPECT_EQ(w0.spans[1].offset, 100u);  // t1, t2 and the padding before each
  EXPECT_EQ(w0.spans[1].n, 156u);
  EXPECT_EQ(w0.spans[1].group, 1u);
  // The constants: each span its group's weight decay and learning rate.
  AdamConfig adam;
  adam.lr = 1e-3f;
  adam.weight_decay = 0.5f;
  std::vector<ConstantsSpan> spans = SpanConstants(w0, 256, adam, 1e-3f, {2e-3f, 4e-3f}, 1, 1.0f);
  ASSERT_EQ(spans.size(), 2u);
  AdamConfig g0 = adam, g1 = adam;
  g0.lr = 2e-3f;
  g0.weight_decay = 0.1f;
  g1.lr = 4e-3f;
  g1.weight_decay = 0.0f;
  EXPECT_EQ(spans[0].constants.decay, MakeAdamConstants(g0, 1, 1.0f).decay);
  EXPECT_EQ(spans[1].constants.decay, 1.0f);
  EXPECT_EQ(spans[1].constants.step_size, MakeAdamConstants(g1, 1, 1.0f).step_size);
  // A job without groups: one span, the job's weight decay and lr.
  v1::JobSpec plain = spec;
  plain.clear_groups();
  for (auto& t : *plain.mutable_tensors()) t.set_group(0);
  ChunkGroups none = ChunkGroupsOf(plain, *layout, layout->chunk_range(1));
  EXPECT_TRUE(none.spans.empty());
  spans = SpanConstants(none, 128, adam, 1e-3f, {}, 1, 1.0f);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].n, 128u);
  EXPECT_EQ(spans[0].constants.decay, MakeAdamConstants(adam, 1, 1.0f).decay);
}

TEST(ChunkGroupsTest, BadGroupsAreRefusedNamingTheField) {
  v1::JobSpec spec = GroupedSpec();
  spec.mutable_tensors(2)->set_group(2);
  absl::Status s = ValidateJobSpec(spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("'t2''s group 2"));
  spec = GroupedSpec();
  spec.mutable_groups(1)->set_weight_decay(NAN);
  s = ValidateJobSpec(spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("groups[1].weight_decay"));
  spec = GroupedSpec();
  for (int i = 0; i < 2000; ++i) spec.add_groups();
  s = ValidateJobSpec(spec).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("groups: 2002"));
  // Without groups every tensor must be in group 0.
  spec = GroupedSpec();
  spec.clear_groups();
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateJobSpec(spec).status()));
}

}  // namespace
}  // namespace strata
