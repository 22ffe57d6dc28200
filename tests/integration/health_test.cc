// The standard gRPC health service on the coordinator and the shard servers,
// and `stratactl health`, which container health checks run.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "testing/health.h"
#include "testing/local_cluster.h"
#include "testing/processes.h"

namespace strata {
namespace {

using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

std::pair<int, std::string> Stratactl(const std::string& args) {
  return testing::RunCommand(absl::StrCat(STRATA_BIN_DIR, "/stratactl ", args));
}

TEST(HealthTest, DaemonsServeTheStandardHealthService) {
  auto cluster = LocalCluster::Start({});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coordinator = (*cluster)->coordinator_address();
  const std::string server = (*cluster)->servers()[0]->address();
  EXPECT_EQ(*testing::HealthOf(coordinator, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(*testing::HealthOf(coordinator, "strata.v1.Coordinator"), HealthCheckResponse::SERVING);
  EXPECT_EQ(*testing::HealthOf(server, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(*testing::HealthOf(server, "strata.v1.ShardServer"), HealthCheckResponse::SERVING);
  EXPECT_EQ(testing::HealthOf(server, "strata.v1.Coordinator").status().code(),
            absl::StatusCode::kNotFound);

  auto [ok_code, ok_output] =
      Stratactl(absl::StrCat("--target=", server, " --service=strata.v1.ShardServer health"));
  EXPECT_EQ(ok_code, 0) << ok_output;
  EXPECT_THAT(ok_output, HasSubstr("strata.v1.ShardServer SERVING"));
  auto [json_code, json_output] =
      Stratactl(absl::StrCat("--coordinator=", coordinator, " --json health"));
  EXPECT_EQ(json_code, 0) << json_output;
  EXPECT_THAT(json_output, HasSubstr("\"status\":\"SERVING\""));
  auto [unknown_code, unknown_output] =
      Stratactl(absl::StrCat("--target=", server, " --service=nope health"));
  EXPECT_EQ(unknown_code, 1);
  EXPECT_THAT(unknown_output, HasSubstr("NOT_FOUND"));

  (*cluster).reset();  // every daemon shuts down
  auto [down_code, down_output] =
      Stratactl(absl::StrCat("--target=", server, " --timeout_s=2 health"));
  EXPECT_EQ(down_code, 1);
  EXPECT_THAT(down_output, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace strata
