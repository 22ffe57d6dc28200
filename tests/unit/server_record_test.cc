// ValidateServerRecord: the forms of a shard server's address and budgets
// the coordinator takes from RegisterServer, and the field each refusal
// names.
#include "coordinator/server_record.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

v1::ServerRecord Record(const std::string& address) {
  v1::ServerRecord server;
  server.set_address(address);
  server.set_host_budget_bytes(uint64_t{1} << 30);
  return server;
}

TEST(ServerRecordTest, AddressesOfEveryFormAreTaken) {
  for (const char* address : {"127.0.0.1:7701", "strata-server-0.cluster.local:1", "[::1]:65535",
                              "[fe80::1]:7701", "localhost:7701"}) {
    EXPECT_TRUE(ValidateServerRecord(Record(address)).ok()) << address;
  }
  v1::ServerRecord tiers = Record("h:1");
  tiers.set_host_budget_bytes(kMaxTierBudgetBytes);
  tiers.set_nvme_budget_bytes(kMaxTierBudgetBytes);
  tiers.set_gpu_budget_bytes(kMaxTierBudgetBytes);
  EXPECT_TRUE(ValidateServerRecord(tiers).ok());
}

TEST(ServerRecordTest, MalformedAddressesAreRefusedNamingTheField) {
  for (const std::string& address :
       {std::string(""), std::string("host"), std::string("host:"), std::string(":7701"),
        std::string("host:0"), std::string("host:65536"), std::string("host:+80"),
        std::string("host:80 "), std::string("host:007"), std::string("a b:80"),
        std::string("-host:80"), std::string("[zz]:80"), std::string("[]:80"),
        std::string("host/evil:80"), std::string("host\n:80"), std::string(300, 'a') + ":80"}) {
    absl::Status s = ValidateServerRecord(Record(address));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(s.message(), HasSubstr("server.address")) << address;
    EXPECT_LT(s.message().size(), 200u) << "the value is echoed whole";
  }
}

TEST(ServerRecordTest, HugeBudgetsAreRefusedNamingTheTier) {
  const std::pair<const char*, void (v1::ServerRecord::*)(uint64_t)> tiers[] = {
      {"host_budget_bytes", &v1::ServerRecord::set_host_budget_bytes},
      {"nvme_budget_bytes", &v1::ServerRecord::set_nvme_budget_bytes},
      {"gpu_budget_bytes", &v1::ServerRecord::set_gpu_budget_bytes},
  };
  for (const auto& [field, set] : tiers) {
    v1::ServerRecord server = Record("h:1");
    (server.*set)(kMaxTierBudgetBytes + 1);
    absl::Status s = ValidateServerRecord(server);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("server.", field))) << s;
  }
}

TEST(ServerRecordTest, ZonesAreShortNamesOrNone) {
  for (const std::string& zone : {std::string(""), std::string("rack-1"), std::string("eu.west_2"),
                                  std::string(kMaxZoneBytes, 'z')}) {
    v1::ServerRecord server = Record("h:1");
    server.set_zone(zone);
    EXPECT_TRUE(ValidateServerRecord(server).ok()) << zone;
  }
  for (const std::string& zone : {std::string("rack 1"), std::string("rack/1"), std::string("r\n"),
                                  std::string(kMaxZoneBytes + 1, 'z'), std::string(100000, 'z')}) {
    v1::ServerRecord server = Record("h:1");
    server.set_zone(zone);
    absl::Status s = ValidateServerRecord(server);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << zone.substr(0, 80);
    EXPECT_THAT(s.message(), HasSubstr("server.zone")) << s;
    EXPECT_LT(s.message().size(), 300u) << "the value is echoed whole";
  }
}

}  // namespace
}  // namespace strata
