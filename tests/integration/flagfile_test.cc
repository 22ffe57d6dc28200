// Daemons read their configuration -- tier budgets included -- from a file
// (--flagfile, one --flag=value per line), the same flags as the command line.
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

TEST(FlagfileTest, TierBudgetsComeFromAConfigFile) {
  const testing::ScratchDir scratch("flagfile_test");
  const std::string& dir = scratch.path();
  std::string bin = STRATA_BIN_DIR;
  testing::Processes daemons;
  std::string coordinator = testing::StartCoordinator(bin, dir, &daemons);
  ASSERT_FALSE(coordinator.empty());
  std::ofstream(dir + "/server.flags") << "# a shard server's configuration\n"
                                       << "--listen=127.0.0.1:0\n"
                                       << "--coordinator=" << coordinator << "\n"
                                       << "--data_dir=" << dir << "/server\n"
                                       << "--host_budget_mib=24\n"
                                       << "--pin_host_memory=false\n"
                                       << "--nvme_dir=" << dir << "/nvme\n"
                                       << "--nvme_budget_mib=40\n"
                                       << "--ready_file=" << dir << "/server.addr\n";
  daemons.pids.push_back(testing::Spawn(
      {bin + "/strata-server", "--flagfile=" + dir + "/server.flags"}, dir + "/server.log"));
  ASSERT_FALSE(testing::WaitReady(dir + "/server.addr").empty());

  ClientOptions options;
  options.coordinator_address = coordinator;
  options.job_id = "flagfile";
  options.job.tensors = {{"w", {1000}}};
  options.job.chunk_num_params = 512;
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::GetPlacementRequest request;
  request.set_job_id("flagfile");
  v1::GetPlacementResponse placement;
  ASSERT_TRUE(CallUnary(stub.get(), &v1::Coordinator::Stub::GetPlacement, request, &placement,
                        absl::Seconds(10))
                  .ok());
  ASSERT_EQ(placement.servers_size(), 1);
  EXPECT_EQ(placement.servers(0).host_budget_bytes(), uint64_t{24} << 20);
  EXPECT_EQ(placement.servers(0).nvme_budget_bytes(), uint64_t{40} << 20);
  client->reset();
}

}  // namespace
}  // namespace strata
