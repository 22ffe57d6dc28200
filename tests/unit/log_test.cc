// FormatBytes: the unit that keeps the figure >= 1, rounded down but GiB.
#include "core/log.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(FormatBytesTest, TakesTheLargestUnitThatKeepsTheFigureAtLeastOne) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1 KiB");
  EXPECT_EQ(FormatBytes(3 * 1024 + 1000), "3 KiB");
  EXPECT_EQ(FormatBytes((uint64_t{1} << 20) - 1), "1023 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{384} << 20), "384 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(FormatBytes(uint64_t{4096} << 20), "4.0 GiB");
}

}  // namespace
}  // namespace strata
