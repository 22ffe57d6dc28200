// CertificateNameMatches and CheckHostAmong: which hosts a certificate's
// names admit, and the error that names the field, the host and the names.
#include "rpc/certified_host.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(CertifiedHostTest, NamesMatchTheirHostExactlyIgnoringCase) {
  EXPECT_TRUE(CertificateNameMatches("localhost", "localhost"));
  EXPECT_TRUE(CertificateNameMatches("LocalHost", "localHOST"));
  EXPECT_TRUE(CertificateNameMatches("127.0.0.1", "127.0.0.1"));
  EXPECT_TRUE(CertificateNameMatches("::1", "::1"));
  EXPECT_FALSE(CertificateNameMatches("127.0.0.1", "127.0.0.10"));
  EXPECT_FALSE(CertificateNameMatches("server", "server.example"));
  EXPECT_FALSE(CertificateNameMatches("", "server"));
}

TEST(CertifiedHostTest, AWildcardMatchesOneLeftMostLabel) {
  const char kName[] = "*.strata-server.ns.svc";
  EXPECT_TRUE(CertificateNameMatches(kName, "strata-server-0.strata-server.ns.svc"));
  EXPECT_TRUE(CertificateNameMatches(kName, "X.STRATA-SERVER.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches(kName, "strata-server.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches(kName, ".strata-server.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches(kName, "a.b.strata-server.ns.svc"));
  EXPECT_FALSE(CertificateNameMatches(kName, "a.strata-server.ns.svc.evil"));
  EXPECT_FALSE(CertificateNameMatches("*.0.0.1", "127.0.0.1:7701"));
}

TEST(CertifiedHostTest, TheHostOfAnAddressMustBeAmongTheNames) {
  const std::vector<std::string> names = {"localhost", "127.0.0.1", "*.svc.local"};
  EXPECT_TRUE(CheckHostAmong(names, "server.address", "127.0.0.1:7701").ok());
  EXPECT_TRUE(CheckHostAmong(names, "server.address", "localhost:1").ok());
  EXPECT_TRUE(CheckHostAmong(names, "server.address", "pod-3.svc.local:7701").ok());
  const absl::Status s = CheckHostAmong(names, "server.address", "10.0.0.2:7701");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("server.address"));
  EXPECT_THAT(s.message(), HasSubstr("10.0.0.2"));
  EXPECT_THAT(s.message(), HasSubstr("localhost, 127.0.0.1, *.svc.local"));
  // An IPv6 host is compared without its brackets.
  EXPECT_TRUE(CheckHostAmong({"::1"}, "server.address", "[::1]:7701").ok());
  EXPECT_FALSE(CheckHostAmong({}, "server.address", "[::1]:7701").ok());
}

TEST(CertifiedHostTest, AnErrorListsAtMostEightNames) {
  std::vector<std::string> names;
  for (int i = 0; i < 100; ++i) names.push_back("host-" + std::to_string(i));
  const absl::Status s = CheckHostAmong(names, "server.address", "other:1");
  EXPECT_THAT(s.message(), HasSubstr("host-7, ...)"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("host-8")));
}

}  // namespace
}  // namespace strata
