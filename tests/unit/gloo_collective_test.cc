// The Gloo collective against plain sums, for world sizes that are and are
// not powers of two, in every dtype; ranks run as threads over real TCP pairs
// on loopback, rendezvousing through a coordinator.
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/collective.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "server/daemons.h"

namespace strata {
namespace {

class GlooCollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.data_dir = ::testing::TempDir() + "/gloo_collective_test_" + std::to_string(getpid()) +
                       "_" + std::to_string(GetParam());
    // A directory left by an earlier run with the same pid would hand the
    // ranks its stale rendezvous addresses.
    std::filesystem::remove_all(options.data_dir);
    data_dir_ = options.data_dir;
    auto coordinator = Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(data_dir_);
  }

  // Runs `body(rank, collective)` on world-size threads.
  void RunRanks(const std::string& group, const std::function<void(int, Collective&)>& body) {
    const int world = GetParam();
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        CollectiveOptions options;
        options.coordinator_address = coordinator_->address();
        options.key_prefix = group + "/";
        options.rank = rank;
        options.size = world;
        options.timeout = absl::Seconds(30);
        auto collective = CreateGlooCollective(options);
        ASSERT_TRUE(collective.ok()) << collective.status();
        body(rank, **collective);
      });
    }
    for (auto& t : threads) t.join();
  }

  std::string data_dir_;
  std::unique_ptr<Coordinator> coordinator_;
};

// Small integers: their sums are exact in every dtype.
float Value(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 7) + rank); }

TEST_P(GlooCollectiveTest, ReduceScatterAllGatherAndAllReduceMatchPlainSums) {
  const int world = GetParam();
  const size_t n = 64 * 3 * 5 * 4;  // divisible by every world size tested
  for (DType dtype : {DType::kFp32, DType::kFp16, DType::kBf16}) {
    RunRanks(absl::StrCat("dtype-", static_cast<int>(dtype)), [&](int rank, Collective& c) {
      std::vector<float> values(n);
      for (size_t i = 0; i < n; ++i) values[i] = Value(rank, i);
      std::vector<uint8_t> data(n * DTypeSize(dtype));
      CastFromFloat(values.data(), dtype, data.data(), n);
      ASSERT_TRUE(c.ReduceScatterSum(dtype, data.data(), n).ok());
      std::vector<float> reduced(n);
      CastToFloat(dtype, data.data(), reduced.data(), n);
      const size_t slice = n / world;
      for (size_t i = rank * slice; i < (rank + 1) * slice; ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r) want += Value(r, i);
        ASSERT_EQ(reduced[i], want) << "rank " << rank << " element " << i;
      }
      // All-gather: every slice ends up holding its rank's input.
      for (size_t i = rank * slice; i < (rank + 1) * slice; ++i) values[i] = -Value(rank, i);
      CastFromFloat(values.data(), dtype, data.data(), n);
      ASSERT_TRUE(c.AllGather(dtype, data.data(), n).ok());
      CastToFloat(dtype, data.data(), reduced.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(reduced[i], -Value(static_cast<int>(i / slice), i)) << "element " << i;
      }
      double sums[2] = {1.0, static_cast<double>(rank)};
      ASSERT_TRUE(c.AllReduceSum(absl::MakeSpan(sums)).ok());
      EXPECT_EQ(sums[0], world);
      EXPECT_EQ(sums[1], world * (world - 1) / 2);
    });
  }
}

// Uneven contributions, some empty (a range that misses a rank's slice).
TEST_P(GlooCollectiveTest, AllGatherVConcatenatesTheRanksInputsInRankOrder) {
  const int world = GetParam();
  std::vector<size_t> counts;
  for (int r = 0; r < world; ++r) counts.push_back(r % 3 == 1 ? 0 : 5 + 7 * r);
  size_t total = 0;
  for (size_t c : counts) total += c;
  for (DType dtype : {DType::kFp32, DType::kBf16}) {
    RunRanks(absl::StrCat("gatherv-", static_cast<int>(dtype)), [&](int rank, Collective& c) {
      const size_t esize = DTypeSize(dtype);
      std::vector<float> input(counts[rank]);
      for (size_t i = 0; i < input.size(); ++i) input[i] = Value(rank, i);
      std::vector<uint8_t> in_bytes(input.size() * esize), out_bytes(total * esize, 0xff);
      CastFromFloat(input.data(), dtype, in_bytes.data(), input.size());
      absl::Status s = c.AllGatherV(dtype, in_bytes.data(), out_bytes.data(), counts);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<float> output(total);
      CastToFloat(dtype, out_bytes.data(), output.data(), total);
      size_t at = 0;
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < counts[r]; ++i, ++at) {
          ASSERT_EQ(output[at], Value(r, i)) << "rank " << r << " element " << i;
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectiveTest, ::testing::Values(1, 2, 3, 4, 5));

}  // namespace
}  // namespace strata
