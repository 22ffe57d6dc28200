// A shard server's resident memory stays within its host-memory budget and
// a fixed overhead while it trains a job whose optimizer state is more than
// twice that budget and lives on NVMe, and whose steps push and pull more
// than that overhead: pushes are applied straight from the requests and
// stay in memory until their chunk is applied, pulled parameters are
// serialized into responses, and the worker keeps only
// max_step_bytes_in_flight of each in flight.
#include <sys/types.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "strata/client.h"
#include "testing/job_runner.h"
#include "testing/process_memory.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// The server process itself (code, RocksDB, gRPC and its threads, metrics:
// 27 MiB idle when measured), one worker's step in flight, and what the
// allocator keeps of it.
constexpr uint64_t kFixedOverheadBytes = 80 * kMiB;
constexpr uint64_t kStepBytesInFlight = 4 * kMiB;

TEST(ResidentMemoryTest, ServerStaysWithinItsHostBudget) {
  if (testing::kUnderAsan)
    GTEST_SKIP() << "ASan's shadow memory and quarantine are not the server's";
  const testing::ScratchDir scratch("resident_memory_test");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  const std::string bin = STRATA_BIN_DIR;
  const std::string coordinator = testing::StartCoordinator(bin, dir, &daemons);
  ASSERT_FALSE(coordinator.empty());
  // 32 Mi parameters in chunks of 256 Ki: 384 MiB of state, 128 MiB of
  // copies (always in host memory) and 64 MiB of FP16 gradients per step.
  // 144 MiB of host memory holds the copies, the staging buffers (2 x 3 MiB)
  // and 3 chunk states: the other 125 are on NVMe.
  const uint64_t host_budget_bytes = 144 * kMiB;
  testing::ServerProcess server =
      testing::StartServer(bin, dir, "server", coordinator,
                           {absl::StrCat("--host_budget_mib=", host_budget_bytes / kMiB),
                            "--nvme_dir=" + dir + "/nvme", "--nvme_budget_mib=1024"},
                           &daemons);
  ASSERT_FALSE(server.address.empty());

  ClientOptions options;
  options.coordinator_address = coordinator;
  options.job_id = "rss-job";
  options.worker_id = "w0";
  options.job.tensors = {{"w", {8192, 4096}}};
  options.job.chunk_num_params = 256 * 1024;
  options.job.adam = AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, true};
  options.step_timeout = absl::Seconds(120);
  options.max_step_bytes_in_flight = kStepBytesInFlight;
  const uint64_t num_params = uint64_t{8192} * 4096;
  options.initial.params = testing::InitialParams(num_params);
  const uint64_t state_bytes = 12 * num_params;
  // FP16 gradients pushed and FP16 parameters pulled.
  const uint64_t step_bytes = 2 * num_params + 2 * num_params;
  ASSERT_GT(state_bytes, 2 * host_budget_bytes);
  ASSERT_GT(step_bytes, kFixedOverheadBytes);

  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  options.initial.params.clear();
  for (int s = 0; s < 3; ++s) {
    absl::Status step = testing::TrainStep(**client);
    ASSERT_TRUE(step.ok()) << step;
  }
  const uint64_t peak_bytes = testing::ProcStatusBytes(server.pid, "VmHWM");
  ASSERT_GT(peak_bytes, 0u) << "no VmHWM for the server";
  RecordProperty("peak_resident_mib", std::to_string(peak_bytes / kMiB));
  // Both bounds: within the budget, and far below the state it trains.
  EXPECT_LE(peak_bytes, host_budget_bytes + kFixedOverheadBytes)
      << "peak resident " << peak_bytes / kMiB << " MiB";
  EXPECT_LT(peak_bytes, state_bytes);
}

}  // namespace
}  // namespace strata
