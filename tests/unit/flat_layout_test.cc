#include "strata/flat_layout.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(FlatLayoutTest, AlignsTensorsAndCutsChunksAndSlices) {
  auto layout = FlatLayout::Create({{"a", {3, 5}}, {"b", {100}}, {"c", {1}}}, 128);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tensor_range(0).begin, 0u);
  EXPECT_EQ(layout->tensor_range(0).end, 15u);
  EXPECT_EQ(layout->tensor_range(1).begin, 64u);
  EXPECT_EQ(layout->tensor_range(2).begin, 192u);
  EXPECT_EQ(layout->num_params(), 193u);
  EXPECT_EQ(layout->num_chunks(), 2u);
  EXPECT_EQ(layout->chunk_range(1).begin, 128u);
  EXPECT_EQ(layout->chunk_range(1).end, 193u);
  EXPECT_EQ(layout->TensorsIn(layout->chunk_range(0)), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(layout->TensorsIn(layout->chunk_range(1)), (std::vector<std::string>{"b", "c"}));
  // 3 workers: padded to a multiple of 3 * 64; slices clipped to the space.
  EXPECT_EQ(layout->PaddedNumParams(3), 384u);
  EXPECT_EQ(layout->WorkerSlice(0, 3).end, 128u);
  EXPECT_EQ(layout->WorkerSlice(1, 3).end, 193u);
  EXPECT_TRUE(layout->WorkerSlice(2, 3).empty());
}

TEST(FlatLayoutTest, RefusesBadSpecs) {
  EXPECT_FALSE(FlatLayout::Create({}, 64).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {4}}}, 100).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {4}}, {"a", {2}}}, 64).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {0}}}, 64).ok());
  EXPECT_FALSE(FlatLayout::Create({{"", {1}}}, 64).ok());
  EXPECT_FALSE(FlatLayout::Create({{"a", {}}}, 64).ok());
}

}  // namespace
}  // namespace strata
