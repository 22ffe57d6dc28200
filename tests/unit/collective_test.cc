// The collectives against plain sums, in every dtype, rendezvousing through a
// coordinator; ranks run as threads. Gloo: world sizes that are and are not
// powers of two, over real TCP pairs on loopback. NCCL: one rank per GPU,
// skipped where the machine has fewer GPUs than ranks (or none).
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/collective.h"
#include "client/device.h"
#include "coordinator/coordinator_server.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "rpc/rendezvous_keys.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

enum class Backend { kGloo, kNccl };

struct World {
  Backend backend;
  int size;
};

std::string WorldName(const ::testing::TestParamInfo<World>& info) {
  return absl::StrCat(info.param.backend == Backend::kGloo ? "Gloo" : "Nccl", info.param.size);
}

class CollectiveTest : public ::testing::TestWithParam<World> {
 protected:
  void SetUp() override {
    if (GetParam().backend == Backend::kNccl && NcclDeviceCount() < GetParam().size) {
      GTEST_SKIP() << GetParam().size << " NCCL ranks need as many GPUs; this machine has "
                   << NcclDeviceCount();
    }
    CoordinatorOptions options;
    options.data_dir = scratch_.path();
    auto coordinator = Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
  }

  // Runs `body(rank, collective)` on world-size threads.
  void RunRanks(const std::string& group, const std::function<void(int, Collective&)>& body) {
    const int world = GetParam().size;
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        CollectiveOptions options;
        options.coordinator_address = coordinator_->address();
        options.key_prefix = RendezvousPrefix("collective-test") + group + "/";
        options.rank = rank;
        options.size = world;
        options.timeout = absl::Seconds(30);
        auto collective = GetParam().backend == Backend::kGloo ? CreateGlooCollective(options)
                                                               : CreateNcclCollective(options);
        ASSERT_TRUE(collective.ok()) << collective.status();
        body(rank, **collective);
      });
    }
    for (auto& t : threads) t.join();
  }

  const testing::ScratchDir scratch_{"collective_test"};
  std::unique_ptr<Coordinator> coordinator_;
};

// Small integers: their sums are exact in every dtype.
float Value(int rank, size_t i) { return static_cast<float>((rank + 1) * (i % 7) + rank); }

TEST_P(CollectiveTest, ReduceScatterAllGatherAndAllReduceMatchPlainSums) {
  const int world = GetParam().size;
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

// The streamed step reduces buckets that straddle the ranks' slices: each
// bucket's segments are its overlaps with the slices. Rounded (BF16) sums of
// random values: the bits depend on the order of the additions, which must be
// ReduceScatterSum's.
TEST_P(CollectiveTest, ReduceScatterSumVOfBucketsGivesTheBitsOfOneReduceScatter) {
  const int world = GetParam().size;
  const size_t n = 64 * 3 * 5 * 4, slice = n / world;
  const uint32_t seed = static_cast<uint32_t>(absl::ToUnixMicros(absl::Now()));
  std::cout << "seed " << seed << "\n";
  const DType dtype = DType::kBf16;
  RunRanks("reduce-scatter-v", [&](int rank, Collective& c) {
    std::mt19937 random(seed + rank);
    std::uniform_real_distribution<float> value(-3.0f, 3.0f);
    std::vector<float> values(n);
    for (float& v : values) v = value(random);
    std::vector<uint8_t> whole(n * 2), bucketed(n * 2);
    CastFromFloat(values.data(), dtype, whole.data(), n);
    bucketed = whole;
    ASSERT_TRUE(c.ReduceScatterSum(dtype, whole.data(), n).ok());
    // Buckets of 97 elements from the end back (as backward completes them).
    for (size_t end = n; end > 0;) {
      const size_t begin = end > 97 ? end - 97 : 0;
      std::vector<size_t> counts(world);
      for (int r = 0; r < world; ++r) {
        const size_t lo = std::max(begin, r * slice), hi = std::min(end, (r + 1) * slice);
        counts[r] = hi > lo ? hi - lo : 0;
      }
      absl::Status s = c.ReduceScatterSumV(dtype, bucketed.data() + begin * 2, counts);
      ASSERT_TRUE(s.ok()) << s;
      end = begin;
    }
    for (size_t i = rank * slice; i < (rank + 1) * slice; ++i) {
      ASSERT_EQ(whole[2 * i], bucketed[2 * i]) << "seed " << seed << " element " << i;
      ASSERT_EQ(whole[2 * i + 1], bucketed[2 * i + 1]) << "seed " << seed << " element " << i;
    }
  });
}

// Uneven contributions, some empty (a range that misses a rank's slice).
TEST_P(CollectiveTest, AllGatherVConcatenatesTheRanksInputsInRankOrder) {
  const int world = GetParam().size;
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

// NCCL on buffers in GPU memory works in place (no staging): each operation
// gives the bits it gives on host buffers. Random BF16 values, so that the
// order of the additions shows.
TEST_P(CollectiveTest, NcclOnGpuBuffersGivesTheBitsOfHostBuffers) {
  if (GetParam().backend != Backend::kNccl) GTEST_SKIP() << "NCCL only";
  const int world = GetParam().size;
  const size_t n = 64 * 3 * 5 * 4, slice = n / world, esize = 2;
  const uint32_t seed = static_cast<uint32_t>(absl::ToUnixMicros(absl::Now()));
  std::cout << "seed " << seed << "\n";
  const DType dtype = DType::kBf16;
  RunRanks("on-gpu", [&](int rank, Collective& c) {
    absl::StatusOr<std::unique_ptr<Device>> gpu = OpenCudaDevice(rank);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    std::mt19937 random(seed + rank);
    std::uniform_real_distribution<float> value(-3.0f, 3.0f);
    std::vector<float> values(n);
    for (float& v : values) v = value(random);
    std::vector<uint8_t> host(n * esize);
    CastFromFloat(values.data(), dtype, host.data(), n);
    absl::StatusOr<DeviceMemory> on_gpu = (*gpu)->Allocate(host.size());
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
    auto to_gpu = [&] { ASSERT_TRUE((*gpu)->Copy(on_gpu->data(), host.data(), host.size()).ok()); };
    auto from_gpu = [&] {
      std::vector<uint8_t> bytes(host.size());
      EXPECT_TRUE((*gpu)->Copy(bytes.data(), on_gpu->data(), bytes.size()).ok());
      return bytes;
    };
    auto mine = [&](const std::vector<uint8_t>& bytes) {
      return std::vector<uint8_t>(bytes.begin() + rank * slice * esize,
                                  bytes.begin() + (rank + 1) * slice * esize);
    };
    to_gpu();
    ASSERT_TRUE(c.ReduceScatterSum(dtype, host.data(), n).ok());
    ASSERT_TRUE(c.ReduceScatterSum(dtype, on_gpu->data(), n).ok());
    EXPECT_EQ(mine(from_gpu()), mine(host)) << "reduce-scatter, seed " << seed;
    CastFromFloat(values.data(), dtype, host.data(), n);
    to_gpu();
    const std::vector<size_t> counts = {slice / 3, slice - slice / 3};  // world 1 or 2
    ASSERT_TRUE(
        c.ReduceScatterSumV(dtype, host.data(), absl::MakeConstSpan(counts).first(world)).ok());
    ASSERT_TRUE(
        c.ReduceScatterSumV(dtype, on_gpu->data(), absl::MakeConstSpan(counts).first(world)).ok());
    const size_t mine_begin = rank == 0 ? 0 : counts[0];
    std::vector<uint8_t> got = from_gpu();
    EXPECT_TRUE(std::equal(host.begin() + mine_begin * esize,
                           host.begin() + (mine_begin + counts[rank]) * esize,
                           got.begin() + mine_begin * esize))
        << "reduce-scatter-v, seed " << seed;
    CastFromFloat(values.data(), dtype, host.data(), n);
    to_gpu();
    ASSERT_TRUE(c.AllGather(dtype, host.data(), n).ok());
    ASSERT_TRUE(c.AllGather(dtype, on_gpu->data(), n).ok());
    EXPECT_EQ(from_gpu(), host) << "all-gather";
    // All-gather-v from this rank's slice on the GPU into GPU memory.
    absl::StatusOr<DeviceMemory> input = (*gpu)->Allocate(slice * esize);
    ASSERT_TRUE(input.ok());
    ASSERT_TRUE(
        (*gpu)->Copy(input->data(), host.data() + rank * slice * esize, slice * esize).ok());
    std::vector<uint8_t> gathered(n * esize);
    const std::vector<size_t> slices(world, slice);
    ASSERT_TRUE(
        c.AllGatherV(dtype, host.data() + rank * slice * esize, gathered.data(), slices).ok());
    ASSERT_TRUE((*gpu)->Zero(on_gpu->data(), on_gpu->size()).ok());
    ASSERT_TRUE(c.AllGatherV(dtype, input->data(), on_gpu->data(), slices).ok());
    EXPECT_EQ(from_gpu(), gathered) << "all-gather-v";
  });
}

// The last rank hangs (never calls the operation); Abort() from another
// thread ends each kind of operation the others wait in, long before the
// timeout (30 s), and every later operation at once. Abort closes no
// connection: each rank's operation ends by its own abort.
TEST_P(CollectiveTest, AbortEndsAnOperationThatWaitsForAHungPeer) {
  const int world = GetParam().size;
  if (world == 1) GTEST_SKIP() << "a world of one waits for nobody";
  const size_t n = 60 * world;
  const std::vector<std::pair<std::string, std::function<absl::Status(Collective&)>>> ops = {
      {"reduce-scatter",
       [&](Collective& c) {
         std::vector<float> v(n, 1.0f);
         return c.ReduceScatterSum(DType::kFp32, v.data(), n);
       }},
      {"all-gather",
       [&](Collective& c) {
         std::vector<float> v(n, 1.0f);
         return c.AllGather(DType::kFp32, v.data(), n);
       }},
      {"all-gather-v",
       [&](Collective& c) {
         std::vector<size_t> counts(world, 3);
         std::vector<float> in(3, 1.0f), out(3 * world);
         return c.AllGatherV(DType::kFp32, in.data(), out.data(), counts);
       }},
      {"all-reduce",
       [&](Collective& c) {
         double sum[1] = {1.0};
         return c.AllReduceSum(absl::MakeSpan(sum));
       }},
  };
  for (const auto& entry : ops) {
    // Named, not bound: a lambda cannot capture a structured binding in C++17.
    const std::string& name = entry.first;
    const auto& op = entry.second;
    absl::Notification others_done;
    std::atomic<int> running{world - 1};
    RunRanks("abort-" + name, [&](int rank, Collective& c) {
      if (rank == world - 1) {
        others_done.WaitForNotification();
        return;
      }
      std::thread aborter([&c] {
        absl::SleepFor(absl::Milliseconds(200));
        c.Abort();
      });
      const absl::Time started = absl::Now();
      absl::Status waited = op(c);
      const absl::Duration took = absl::Now() - started;
      aborter.join();
      EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << name << ": " << waited;
      EXPECT_LT(took, absl::Seconds(10)) << name;
      absl::Status later = op(c);
      EXPECT_EQ(later.code(), absl::StatusCode::kAborted) << name << " after the abort: " << later;
      // A rank that returns closes its pairs, which would fail a peer whose
      // own abort has not come yet with UNAVAILABLE: every rank stays until
      // all have checked.
      if (--running == 0) others_done.Notify();
      others_done.WaitForNotification();
    });
  }
}

// Gloo writes to sockets without MSG_NOSIGNAL: once a group formed, SIGPIPE
// is ignored, so that a peer dying mid-write fails the collective instead of
// killing this process (ElasticTest kills workers while others write).
TEST_P(CollectiveTest, AfterAGlooGroupSigpipeIsIgnored) {
  if (GetParam().backend != Backend::kGloo) GTEST_SKIP() << "Gloo only";
  RunRanks("sigpipe", [](int, Collective&) {});
  struct sigaction current {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

// A host this machine cannot listen on is a configuration error, named at
// once: no retry makes it one.
TEST(GlooCollectiveTest, AnAddressThisHostDoesNotHaveIsNamed) {
  CollectiveOptions options;
  options.coordinator_address = "127.0.0.1:1";  // never reached
  options.key_prefix = RendezvousPrefix("collective-test") + "bad-host/";
  options.size = 2;
  options.hostname = "192.0.2.1";  // TEST-NET-1 (RFC 5737): no host has it
  auto collective = CreateGlooCollective(options);
  ASSERT_FALSE(collective.ok());
  EXPECT_EQ(collective.status().code(), absl::StatusCode::kInvalidArgument) << collective.status();
  EXPECT_NE(collective.status().message().find("collective_hostname '192.0.2.1'"),
            std::string::npos)
      << collective.status();
}

// A peer that wrote its keys and then left the generation is found gone
// within the connect bound (10 s), not after 5x the collective timeout:
// whether this rank connects (refused at once) or listens for the peer
// (which gloo decides by comparing the addresses: both orders are tried).
TEST(GlooCollectiveTest, APeerThatLeftAfterWritingItsKeysFailsTheFormationSoon) {
  const testing::ScratchDir scratch("collective_test");
  CoordinatorOptions coordinator_options;
  coordinator_options.data_dir = scratch.path();
  auto coordinator = Coordinator::Start(coordinator_options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  for (const char* returning_host : {"127.0.0.1", "127.0.0.3"}) {
    CollectiveOptions options;
    options.coordinator_address = (*coordinator)->address();
    options.key_prefix =
        absl::StrCat(RendezvousPrefix("collective-test"), "left-", returning_host, "/");
    options.size = 2;
    options.timeout = absl::Seconds(30);
    options.hostname = "127.0.0.2";
    // Both ranks form the group and close it: rank 1's keys stay, naming
    // pairs no one listens on any more.
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([options, rank]() mutable {
        options.rank = rank;
        auto formed = CreateGlooCollective(options);
        EXPECT_TRUE(formed.ok()) << formed.status();
      });
    }
    for (std::thread& t : ranks) t.join();
    // Rank 0 comes again, on another address, and finds rank 1's keys.
    options.rank = 0;
    options.hostname = returning_host;
    const absl::Time started = absl::Now();
    auto formed = CreateGlooCollective(options);
    const absl::Duration took = absl::Now() - started;
    EXPECT_FALSE(formed.ok()) << returning_host;
    EXPECT_LT(took, absl::Seconds(20)) << returning_host << ": " << formed.status();
    std::printf("rank 0 on %s gave up after %s: %s\n", returning_host,
                absl::FormatDuration(took).c_str(), formed.status().ToString().c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectiveTest,
                         ::testing::Values(World{Backend::kGloo, 1}, World{Backend::kGloo, 2},
                                           World{Backend::kGloo, 3}, World{Backend::kGloo, 4},
                                           World{Backend::kGloo, 5}, World{Backend::kNccl, 1},
                                           World{Backend::kNccl, 2}),
                         WorldName);

}  // namespace
}  // namespace strata
