// LogEvent: one line per event whatever its message holds; FormatBytes: the
// unit that keeps the figure >= 1, rounded down but GiB.
#include "core/log.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(LogEventTest, BytesOutsidePrintableAsciiAreEscapedSoThatAnEventIsOneLine) {
  std::string message = "job f\bzz\n2026-01-01T00:00:00.000Z coordinator: forged\x1b[2J\xc3";
  message.push_back('\0');
  testing::internal::CaptureStderr();
  LogEvent("coordinator", message);
  const std::string written = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(written.empty());
  EXPECT_EQ(written.find('\n'), written.size() - 1) << written;
  EXPECT_TRUE(absl::EndsWith(written,
                             " coordinator: job f\\x08zz\\x0a2026-01-01T00:00:00.000Z coordinator: "
                             "forged\\x1b[2J\\xc3\\x00\n"))
      << written;
}

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
