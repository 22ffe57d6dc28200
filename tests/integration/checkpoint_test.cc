// Checkpoints: saved while a job trains (every N steps, old ones pruned),
// restored onto another number of servers and workers with another chunk
// size (continuing bitwise), atomic under a SIGKILL during the write, and
// refused with DATA_LOSS / FAILED_PRECONDITION when damaged or mismatched.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/checkpoint_store.h"
#include "core/chunk_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rpc/grpc_util.h"
#include "rpc/token.h"
#include "shard/state_arena.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/process_memory.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::pair<int, std::string> Stratactl(const std::string& coordinator, const std::string& args) {
  return testing::RunCommand(
      absl::StrCat(STRATA_BIN_DIR, "/stratactl --coordinator=", coordinator, " ", args));
}

// The steps of the job's complete checkpoints in `dir`, oldest first.
std::vector<int64_t> ListedSteps(const std::string& coordinator, const std::string& job,
                                 const std::string& dir) {
  auto [code, output] = Stratactl(
      coordinator, absl::StrCat("--json --job=", job, " --dir=", dir, " checkpoint list"));
  EXPECT_EQ(code, 0) << output;
  std::vector<int64_t> steps;
  if (code != 0) return steps;
  for (const auto& c : nlohmann::json::parse(output)) steps.push_back(c["step"].get<int64_t>());
  return steps;
}

// Waits up to 5 s for `server`'s checkpoint arena to hold `want` bytes;
// what it holds then.
uint64_t AwaitHeld(const ShardServer& server, uint64_t want) {
  for (int i = 0; i < 100 && server.checkpoint_arena().held_bytes() != want; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return server.checkpoint_arena().held_bytes();
}

// `job_id` as the coordinator at `coordinator` has it (GetJob; a failure
// fails the test).
v1::JobInfo JobOf(const std::string& coordinator, const std::string& job_id) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::JobInfo job;
  const absl::Status got =
      CallUnary(stub.get(), &v1::Coordinator::Stub::GetJob, get, &job, absl::Seconds(10));
  EXPECT_TRUE(got.ok()) << got;
  return job;
}

// `o`'s job restored as `job_id` from `checkpoint`, expected at `step`
// (nullptr and a failed test when the restore fails).
std::unique_ptr<Client> RestoreAs(ClientOptions o, const std::string& job_id,
                                  const std::string& checkpoint, int64_t step) {
  o.job_id = job_id;
  o.initial.checkpoint = checkpoint;
  auto restored = Client::Connect(o);
  if (!restored.ok()) {
    ADD_FAILURE() << "restore from " << checkpoint << ": " << restored.status();
    return nullptr;
  }
  EXPECT_EQ((*restored)->step(), step);
  return *std::move(restored);
}

// Every chunk of `job`, allocated on one server as the coordinator asks.
v1::AllocateChunksRequest AllocationOf(const v1::JobInfo& job) {
  v1::AllocateChunksRequest allocate;
  *allocate.mutable_spec() = job.spec();
  for (const v1::ChunkAssignment& a : job.chunks()) *allocate.add_chunks() = a.chunk();
  if (!job.worker_token().empty()) {
    allocate.set_worker_token_sha256(TokenDigest(job.worker_token()));
  }
  return allocate;
}

absl::Status Allocate(const ShardServer& server, const v1::AllocateChunksRequest& allocate) {
  auto shard = v1::ShardServer::NewStub(MakeChannel(server.address()));
  v1::AllocateChunksResponse allocated;
  return CallUnary(shard.get(), &v1::ShardServer::Stub::AllocateChunks, allocate, &allocated,
                   absl::Seconds(10));
}

// Test 1: checkpoints every 5 steps of a 2-server, 2-worker job (chunks of
// 256), the newest 3 kept; the oldest kept one (step 5 or 10: a multiple
// that training passes while the previous save writes is skipped) restored
// onto 3 servers and 1 worker with chunks of 192 trains to step 20 on the
// same data and ends with the same FP32 state, bit for bit, as the
// uninterrupted job. (Pruning apart from timing: CheckpointStoreTest.)
TEST(CheckpointTest, RestoresOnAnotherTopologyAndChunkSizeAndContinuesBitwise) {
  const testing::ScratchDir scratch("checkpoint_topology");
  const std::string& dir = scratch.path();
  auto first = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(first.ok()) << first.status();
  ClientOptions o = testing::SmallFp32Job((*first)->coordinator_address(), "ckpt");
  o.job.checkpoint_every_steps = 5;
  o.job.checkpoint_keep_last = 3;
  o.job.checkpoint_dir = dir;
  const uint64_t n = FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params();
  o.initial.params = testing::InitialParams(n);
  auto gradient = [n](int rank, int64_t step, int micro) {
    return testing::Gradient(n, rank, step, micro);
  };
  const MasterState uninterrupted = testing::RunWorkers(o, 20, 1, gradient).master;
  ASSERT_EQ(uninterrupted.step, 20);

  // The save of step 20 may still be writing when training ends.
  std::vector<int64_t> steps;
  for (int i = 0; i < 300; ++i) {
    steps = ListedSteps(o.coordinator_address, "ckpt", dir);
    if (!steps.empty() && steps.back() == 20) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), 20);
  EXPECT_LE(steps.size(), 3u);
  for (int64_t step = 1; step <= 20; ++step) {
    const bool listed = std::find(steps.begin(), steps.end(), step) != steps.end();
    EXPECT_EQ(fs::exists(CheckpointPath(dir, "ckpt", step)), listed) << step;
    EXPECT_TRUE(!listed || step % 5 == 0) << step;
  }
  const int64_t from = steps.front();
  ASSERT_LT(from, 20) << "no checkpoint before step 20 was kept";

  auto second = LocalCluster::Start({3, uint64_t{64} << 20, 1});
  ASSERT_TRUE(second.ok()) << second.status();
  ClientOptions r = testing::SmallFp32Job((*second)->coordinator_address(), "ckpt");
  r.job.world_size = 1;
  r.job.chunk_num_params = 192;
  r.initial.checkpoint = CheckpointPath(dir, "ckpt", from);
  // One worker computes both ranks' gradients as two micro-batches; the
  // runner numbers steps from 1: these are steps from + 1 to 20.
  const MasterState restored =
      testing::RunWorkers(r, static_cast<int>(20 - from), 2, [&](int, int64_t step, int micro) {
        return gradient(micro, step + from, 0);
      }).master;
  testing::ExpectSameState(restored, uninterrupted);
}

// Every job gets the memory its saves will keep chunk states aside in
// faulted in, in the background, when its chunks are allocated (the servers
// keep no region of their own here): one 4 KiB piece per chunk of 256
// parameters, kept for the saves (StateArenaTest: takes reuse kept pieces).
// A dropped job's pieces are freed.
TEST(CheckpointTest, EachJobGetsMemoryForItsSavesFaultedInAtAllocationUntilDropped) {
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto held_bytes = [&] {
    uint64_t held = 0;
    for (const auto& server : (*cluster)->servers())
      held += server->checkpoint_arena().held_bytes();
    return held;
  };
  auto await_held = [&](uint64_t want) {
    for (int i = 0; i < 100 && held_bytes() != want; ++i) absl::SleepFor(absl::Milliseconds(50));
    return held_bytes();
  };
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "first");
  o.job.world_size = 1;
  ASSERT_TRUE(Client::Connect(o).ok());
  const uint64_t per_job = FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_chunks() *
                           StateArena::kAlignment;
  EXPECT_EQ(await_held(per_job), per_job);
  o.job_id = "second";
  ASSERT_TRUE(Client::Connect(o).ok());
  EXPECT_EQ(await_held(2 * per_job), 2 * per_job) << "the second job's pieces were not added";

  v1::DropJobRequest drop;
  drop.set_job_id("first");
  for (const auto& server : (*cluster)->servers()) {
    auto shard = v1::ShardServer::NewStub(MakeChannel(server->address()));
    v1::DropJobResponse unused;
    ASSERT_TRUE(
        CallUnary(shard.get(), &v1::ShardServer::Stub::DropJob, drop, &unused, absl::Seconds(10))
            .ok());
  }
  EXPECT_EQ(held_bytes(), per_job) << "the dropped job's pieces were kept";
}

// A job allocated again with the chunks it has (as each round of a move
// allocates it on the servers that keep their copies) keeps the memory
// faulted in for its saves: none of it is freed to be faulted in again.
TEST(CheckpointTest, AReallocationKeepsTheMemoryFaultedInForItsSaves) {
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ShardServer& server = *(*cluster)->servers().front();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "kept");
  o.job.world_size = 1;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t per_job = (*client)->layout().num_chunks() * StateArena::kAlignment;
  ASSERT_EQ(AwaitHeld(server, per_job), per_job);
  const uint64_t allocated = server.checkpoint_arena().allocated_beyond_bytes();
  ASSERT_EQ(allocated, per_job);

  // As a move's fenced round allocates it.
  v1::AllocateChunksRequest allocate = AllocationOf(JobOf(o.coordinator_address, "kept"));
  allocate.set_min_generation(2);
  allocate.set_chunks_held(true);
  for (int round = 0; round < 3; ++round) ASSERT_TRUE(Allocate(server, allocate).ok());
  absl::SleepFor(absl::Milliseconds(500));  // a fault-in would be done
  EXPECT_EQ(server.checkpoint_arena().held_bytes(), per_job);
  EXPECT_EQ(server.checkpoint_arena().allocated_beyond_bytes(), allocated)
      << "memory kept for the job's saves was freed and faulted in again";
}

// A job restored from a checkpoint gets that memory faulted in once its
// chunks are loaded, not alongside the load, which it would slow down: an
// allocation that says a load follows (AllocateChunksRequest.
// loads_checkpoint) faults nothing in by itself; the restore's load does.
TEST(CheckpointTest, ARestoredJobGetsMemoryForItsSavesFaultedInAfterItsLoad) {
  const testing::ScratchDir scratch("checkpoint_fault_in_after_load");
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ShardServer& server = *(*cluster)->servers().front();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "saved");
  o.job.world_size = 1;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t n = (*client)->layout().num_params();
  ASSERT_TRUE((*client)->AccumulateGradients(testing::Gradient(n, 0, 1, 0)).ok());
  ASSERT_TRUE((*client)->Step().ok());
  const uint64_t per_job = (*client)->layout().num_chunks() * StateArena::kAlignment;
  ASSERT_EQ(AwaitHeld(server, per_job), per_job);
  auto [code, output] =
      Stratactl(o.coordinator_address,
                absl::StrCat("--job=saved --dir=", scratch.path(), " checkpoint save"));
  ASSERT_EQ(code, 0) << output;

  // The saved job's chunks again, as a job that awaits its load.
  v1::AllocateChunksRequest allocate = AllocationOf(JobOf(o.coordinator_address, "saved"));
  allocate.mutable_spec()->set_job_id("awaits-its-load");
  allocate.set_loads_checkpoint(true);
  ASSERT_TRUE(Allocate(server, allocate).ok());
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(server.checkpoint_arena().held_bytes(), per_job) << "faulted in before a load";

  // A restore: what every job here reserved is faulted in after its load.
  ASSERT_NE(RestoreAs(o, "restored", CheckpointPath(scratch.path(), "saved", 1), 1), nullptr);
  EXPECT_EQ(AwaitHeld(server, 3 * per_job), 3 * per_job) << "nothing faulted in after the load";
}

// A TCP listener on loopback that accepts nothing: a client's connection
// completes in the kernel's backlog and then hears nothing until Close()
// resets it.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), size) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &size) != 0) {
      ADD_FAILURE() << "loopback listener: " << std::strerror(errno);
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  }
  ~SilentListener() { Close(); }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  const std::string& address() const { return address_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string address_;
};

// A server faults in a job's checkpoint memory only once no seed runs on
// it, as a move's seeds from several sources run at once and its workers
// wait for the fenced ones: a job allocated while a copy is built aside
// from a source that never answers gets its memory once that seed ends.
TEST(CheckpointTest, CheckpointMemoryIsFaultedInOnceNoSeedRuns) {
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ShardServer& server = *(*cluster)->servers().front();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "built");
  o.job.world_size = 1;
  auto built = Client::Connect(o);
  ASSERT_TRUE(built.ok()) << built.status();
  const uint64_t per_job = (*built)->layout().num_chunks() * StateArena::kAlignment;
  ASSERT_EQ(AwaitHeld(server, per_job), per_job);

  SilentListener source;
  const v1::JobInfo job = JobOf(o.coordinator_address, "built");
  v1::SeedChunksRequest prepare;
  prepare.set_job_id("built");
  prepare.set_source_address(source.address());
  prepare.set_prepare(true);
  *prepare.mutable_spec() = job.spec();
  *prepare.add_chunks() = job.chunks(0).chunk();
  auto shard = v1::ShardServer::NewStub(MakeChannel(server.address()));
  absl::Status prepared;
  std::thread seed([&] {
    v1::SeedChunksResponse response;
    prepared = CallUnary(shard.get(), &v1::ShardServer::Stub::SeedChunks, prepare, &response,
                         absl::Seconds(60));
  });
  // The copy has taken its memory from the arena: the seed reads its source.
  for (int i = 0; i < 100 && server.checkpoint_arena().peak_taken_bytes() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_GT(server.checkpoint_arena().peak_taken_bytes(), 0u) << "the seed took no memory";
  const uint64_t held_during_seed = server.checkpoint_arena().held_bytes();

  o.job_id = "allocated";
  auto allocated = Client::Connect(o);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  absl::SleepFor(absl::Milliseconds(500));  // a fault-in would be done
  EXPECT_EQ(server.checkpoint_arena().held_bytes(), held_during_seed)
      << "memory faulted in while a seed ran";

  source.Close();
  seed.join();
  EXPECT_TRUE(prepared.ok()) << prepared;
  EXPECT_EQ(AwaitHeld(server, 2 * per_job), 2 * per_job)
      << "the new job's memory not faulted in after the seed";
}

// A restore's allocation leaves the new job's host memory (states and
// copies) to its load, which faults it in as it writes it (the kernel
// clearing pages alongside the reads, not before them), and page-locks it
// after: nothing is locked before the load, all of it once restored.
TEST(CheckpointTest, ARestoredJobsMemoryIsPageLockedOnceLoaded) {
  constexpr uint64_t kChunkParams = 32768;  // states and copies of 64 KiB and up: whole pages
  if (testing::kUnderAsan) GTEST_SKIP() << "ASan's mlock locks nothing";
  if (testing::MemlockLimitBytes() < (uint64_t{64} << 20)) {
    GTEST_SKIP() << "memlock limit below 64 MiB";
  }
  const testing::ScratchDir scratch("checkpoint_pinned_after_load");
  LocalClusterOptions c{1, uint64_t{64} << 20, 1};
  c.pin_host_memory = true;
  auto cluster = LocalCluster::Start(c);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const ShardServer& server = *(*cluster)->servers().front();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "saved");
  o.job.world_size = 1;
  o.job.tensors = {{"w", {256, 256}}};
  o.job.chunk_num_params = kChunkParams;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t num_chunks = (*client)->layout().num_chunks();
  ASSERT_EQ(num_chunks, 2u);
  ASSERT_TRUE((*client)->AccumulateGradients(testing::Gradient(2 * kChunkParams, 0, 1, 0)).ok());
  ASSERT_TRUE((*client)->Step().ok());
  auto [code, output] =
      Stratactl(o.coordinator_address,
                absl::StrCat("--job=saved --dir=", scratch.path(), " checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  const uint64_t copies = num_chunks * ChunkCopyBytes(kChunkParams, DType::kFp32);
  const uint64_t states = num_chunks * StateBytes(kChunkParams, StatePrecision::kFp32);

  const uint64_t before = testing::LockedBytes();
  v1::AllocateChunksRequest allocate = AllocationOf(JobOf(o.coordinator_address, "saved"));
  allocate.mutable_spec()->set_job_id("awaits-its-load");
  allocate.set_loads_checkpoint(true);
  ASSERT_TRUE(Allocate(server, allocate).ok());
  EXPECT_EQ(testing::LockedBytes(), before) << "locked before its load";

  ASSERT_NE(RestoreAs(o, "restored", CheckpointPath(scratch.path(), "saved", 1), 1), nullptr);
  EXPECT_EQ(testing::LockedBytes() - before, copies + states) << "not locked once loaded";
}

// The manifest keeps the loss scaler of its step (reported by the pushes);
// an FP16 job restored from it starts with that scaler, not the initial one.
TEST(CheckpointTest, ARestoredJobTakesTheLossScaleOfItsCheckpoint) {
  const testing::ScratchDir scratch("checkpoint_loss_scale");
  const std::string& dir = scratch.path();
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "scaled");
  o.job.world_size = 1;
  o.job.dtype = DType::kFp16;
  o.loss_scale.initial_scale = 1024.0f;
  o.loss_scale.growth_interval = 3;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const uint64_t n = (*client)->layout().num_params();
  // Three good steps double the scale; an Inf at the 5th attempt halves it.
  for (int attempt = 1; (*client)->step() < 8; ++attempt) {
    std::vector<float> g = testing::Gradient(n, 0, attempt, 0);
    if (attempt == 5) g[7] = INFINITY;
    ASSERT_TRUE((*client)->AccumulateGradients(g).ok());
    ASSERT_TRUE((*client)->Step().ok());
  }
  const float scale = (*client)->loss_scale();
  const int good_steps = (*client)->loss_scale_good_steps();
  EXPECT_EQ(scale, 2048.0f);
  EXPECT_EQ(good_steps, 1);
  auto [code, output] = Stratactl(o.coordinator_address,
                                  absl::StrCat("--job=scaled --dir=", dir, " checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  std::ifstream manifest(CheckpointPath(dir, "scaled", 8) + "/manifest.json");
  const auto json = nlohmann::json::parse(manifest);
  EXPECT_EQ(json["loss_scale"]["scale"].get<float>(), scale) << json.dump();
  EXPECT_EQ(json["loss_scale"]["good_steps"].get<int>(), good_steps) << json.dump();

  auto restored = RestoreAs(o, "scaled-restored", CheckpointPath(dir, "scaled", 8), 8);
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(restored->loss_scale(), scale);
  EXPECT_EQ(restored->loss_scale_good_steps(), good_steps);
}

// Test 5 and bad input: damaged or mismatched checkpoints are refused before
// any step, naming the file; a refused restore leaves no job behind (the id
// can be restored again), and the running job is untouched.
TEST(CheckpointTest, DamagedOrMismatchedCheckpointsAreRefused) {
  const testing::ScratchDir scratch("checkpoint_damaged");
  const std::string& dir = scratch.path();
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coordinator = (*cluster)->coordinator_address();
  ClientOptions o = testing::SmallFp32Job(coordinator, "source");
  o.job.world_size = 1;
  const uint64_t n = FlatLayout::Create(o.job.tensors, o.job.chunk_num_params)->num_params();
  o.initial.params = testing::InitialParams(n);
  const MasterState saved = testing::RunWorkers(o, 3, 1, [n](int rank, int64_t step, int micro) {
                              return testing::Gradient(n, rank, step, micro);
                            }).master;
  auto [code, output] =
      Stratactl(coordinator, absl::StrCat("--json --job=source --dir=", dir, " checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("\"step\":3"));
  const std::string good = CheckpointPath(dir, "source", 3);

  // A copy of the checkpoint, damaged by `damage`, restored as job `job`.
  int copies = 0;
  auto restore = [&](const std::function<void(const std::string&)>& damage, ClientOptions options) {
    std::string copy = absl::StrCat(dir, "/copy-", ++copies);
    fs::copy(good, copy, fs::copy_options::recursive);
    damage(copy);
    options.coordinator_address = coordinator;
    options.initial.checkpoint = copy;
    options.initial.params.clear();
    return Client::Connect(options).status();
  };
  ClientOptions target = testing::SmallFp32Job(coordinator, "target");
  target.job.world_size = 1;
  target.rendezvous_timeout = absl::Seconds(10);
  const std::string chunk1 = "/chunk-00000001.bin";

  absl::Status corrupted = restore(
      [&](const std::string& copy) {
        std::fstream f(copy + chunk1, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(100);
        f.put('\x5a');
      },
      target);
  EXPECT_EQ(corrupted.code(), absl::StatusCode::kDataLoss) << corrupted;
  EXPECT_THAT(corrupted.message(), HasSubstr("chunk-00000001.bin: checksum mismatch"));

  absl::Status truncated =
      restore([&](const std::string& copy) { fs::resize_file(copy + chunk1, 1000); }, target);
  EXPECT_EQ(truncated.code(), absl::StatusCode::kDataLoss) << truncated;
  EXPECT_THAT(truncated.message(), HasSubstr("chunk-00000001.bin has 1000 bytes"));

  absl::Status missing =
      restore([&](const std::string& copy) { fs::remove(copy + chunk1); }, target);
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("chunk-00000001.bin is missing"));

  absl::Status garbled = restore(
      [&](const std::string& copy) { std::ofstream(copy + "/manifest.json") << "{\"step\": "; },
      target);
  EXPECT_EQ(garbled.code(), absl::StatusCode::kDataLoss) << garbled;
  EXPECT_THAT(garbled.message(), HasSubstr("manifest.json does not parse"));

  absl::Status no_manifest =
      restore([&](const std::string& copy) { fs::remove(copy + "/manifest.json"); }, target);
  EXPECT_EQ(no_manifest.code(), absl::StatusCode::kFailedPrecondition) << no_manifest;
  EXPECT_THAT(no_manifest.message(), HasSubstr("is not a checkpoint"));

  ClientOptions other_model = target;
  other_model.job.tensors[2].shape = {29, 6};
  absl::Status mismatched = restore([](const std::string&) {}, other_model);
  EXPECT_EQ(mismatched.code(), absl::StatusCode::kFailedPrecondition) << mismatched;
  EXPECT_THAT(mismatched.message(), HasSubstr("is of another model: tensor 2 ('w2')"));

  // Nothing was created; the same id restores from the good checkpoint, and
  // the source job still has its state.
  auto [jobs_code, jobs] = Stratactl(coordinator, "--json jobs");
  EXPECT_THAT(jobs, ::testing::Not(HasSubstr("\"target\"")));
  target.initial.checkpoint = good;
  target.initial.params.clear();
  auto restored = Client::Connect(target);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto state = (*restored)->ReadMasterState();
  ASSERT_TRUE(state.ok()) << state.status();
  testing::ExpectSameState(*state, saved);
}

// Test 2: the shard server is SIGKILLed while it writes the chunks of a
// second checkpoint: the save fails, nothing of it is visible, and the
// previous checkpoint restores with every checksum verified.
TEST(CheckpointTest, SigkillDuringASaveLeavesThePreviousCheckpointUsable) {
  const testing::ScratchDir scratch("checkpoint_sigkill");
  const std::string& dir = scratch.path();
  testing::Processes daemons;
  const std::string bin = STRATA_BIN_DIR;
  const std::string coordinator = testing::StartCoordinator(bin, dir, &daemons);
  ASSERT_FALSE(coordinator.empty());
  const pid_t server =
      testing::StartServer(bin, dir, "server", coordinator, {"--host_budget_mib=256"}, &daemons)
          .pid;
  ASSERT_FALSE(testing::WaitReady(dir + "/server.addr").empty());

  // 16 chunks of 6 MiB of state: a save writes and syncs them one by one.
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = "big";
  o.job.tensors = {{"w", {8, 1 << 20}}};
  o.job.chunk_num_params = 1 << 19;
  o.job.dtype = DType::kFp16;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto train = [&](int steps) {
    for (int s = 0; s < steps; ++s) {
      ASSERT_TRUE((*client)->AccumulateGradients(testing::Gradient(8 << 20, 0, s, 0)).ok());
      ASSERT_TRUE((*client)->Step().ok());
    }
  };
  train(2);
  auto at_two = (*client)->ReadMasterState();
  ASSERT_TRUE(at_two.ok()) << at_two.status();
  const std::string checkpoints = dir + "/checkpoints";
  auto [code, output] =
      Stratactl(coordinator, absl::StrCat("--job=big --dir=", checkpoints, " checkpoint save"));
  ASSERT_EQ(code, 0) << output;
  train(1);

  FILE* save = popen(absl::StrCat(bin, "/stratactl --coordinator=", coordinator,
                                  " --job=big --dir=", checkpoints, " checkpoint save 2>&1")
                         .c_str(),
                     "r");
  ASSERT_NE(save, nullptr);
  // Kill the server once the first chunk file of step 3 is there.
  bool writing = false;
  for (int i = 0; i < 20000 && !writing; ++i) {
    for (const auto& entry : fs::directory_iterator(checkpoints + "/big")) {
      if (entry.path().filename().string().rfind(".step-3.", 0) == 0 &&
          fs::exists(entry.path() / "chunk-00000000.bin")) {
        writing = true;
      }
    }
    if (!writing) absl::SleepFor(absl::Microseconds(500));
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  daemons.Forget(server);
  ASSERT_TRUE(writing);
  std::string save_output;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), save) != nullptr) save_output += buffer;
  EXPECT_NE(pclose(save), 0) << save_output;
  EXPECT_THAT(save_output, HasSubstr("UNAVAILABLE"));
  EXPECT_EQ(ListedSteps(coordinator, "big", checkpoints), std::vector<int64_t>{2});
  EXPECT_FALSE(fs::exists(CheckpointPath(checkpoints, "big", 3)));

  auto fresh = LocalCluster::Start({2, uint64_t{256} << 20, 1});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ClientOptions r = o;
  r.coordinator_address = (*fresh)->coordinator_address();
  r.job.chunk_num_params = 3 << 18;
  r.initial.checkpoint = CheckpointPath(checkpoints, "big", 2);
  auto restored = Client::Connect(r);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto state = (*restored)->ReadMasterState();
  ASSERT_TRUE(state.ok()) << state.status();
  testing::ExpectSameState(*state, *at_two);
}

}  // namespace
}  // namespace strata
