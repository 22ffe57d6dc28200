// elastic_worker: a training worker for the elastic tests and benchmark. It
// trains testing::LinearModel through Client::Step(GradientFn) until the job
// reaches --steps, appending one JSON line per completed step to --log. It
// can leave gracefully after a step, or SIGKILL itself during or right after
// one, to play the part of a lost worker.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "core/command_line.h"
#include "nlohmann/json.hpp"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "testing/linear_model.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7700", "coordinator host:port");
ABSL_FLAG(std::string, job, "elastic", "job id");
ABSL_FLAG(std::string, worker_id, "", "worker id (default: host-pid)");
ABSL_FLAG(int, world_size, 2, "workers the job starts with");
ABSL_FLAG(int64_t, samples_per_step, 24, "global batch");
ABSL_FLAG(int64_t, micro_batch_samples, 4, "samples per gradient call");
ABSL_FLAG(int64_t, steps, 40, "train until the job has completed this step");
ABSL_FLAG(std::string, steps_file, "",
          "once this file exists, the step number it holds takes the place of --steps "
          "(a test ends an open-ended run)");
ABSL_FLAG(int64_t, leave_after_step, 0, "leave the job once this step is complete (0: never)");
ABSL_FLAG(int64_t, die_in_step, 0,
          "SIGKILL this process once a server holds pushes of this step, or at the latest "
          "when its next step's first gradient is asked for (0: never)");
ABSL_FLAG(int64_t, die_after_step, 0, "SIGKILL this process once this step is complete");
ABSL_FLAG(std::string, log, "", "append one JSON line per completed step to this file");
ABSL_FLAG(int64_t, collective_timeout_ms, 20000, "how long a collective waits for its peers");
ABSL_FLAG(std::string, collective_host, "127.0.0.1",
          "the address of this worker that its peers' collectives connect to");
ABSL_FLAG(uint64_t, checkpoint_every_steps, 0, "the job's periodic checkpoints (0: none)");
ABSL_FLAG(std::string, checkpoint_dir, "", "where the job's checkpoints go");
ABSL_FLAG(int64_t, step_pause_ms, 0, "sleep this long after each step (a slower job)");
ABSL_FLAG(uint32_t, replicas, 1, "copies of each chunk on distinct shard servers");
ABSL_FLAG(bool, stream, false,
          "stream the step: the last micro-batch's gradient goes tensor by tensor "
          "(GradientsReady), in buckets of 512 parameters");

namespace strata {
namespace {

ClientOptions Options() {
  ClientOptions o;
  o.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.job.tensors = testing::LinearModel();
  o.job.world_size = absl::GetFlag(FLAGS_world_size);
  o.job.samples_per_step = absl::GetFlag(FLAGS_samples_per_step);
  o.micro_batch_samples = absl::GetFlag(FLAGS_micro_batch_samples);
  o.job.chunk_num_params = 1024;
  o.job.dtype = DType::kFp32;
  o.job.adam = testing::kLinearAdam;
  o.loss_scale = LossScaleOptions{false, 1.0f, 2.0f, 0.5f, 1000, 1.0f};
  o.collective_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_collective_timeout_ms));
  o.collective_hostname = absl::GetFlag(FLAGS_collective_host);
  o.initial.params = testing::LinearInitialParams();
  o.job.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  o.job.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.job.replicas = absl::GetFlag(FLAGS_replicas);
  o.bucket_num_params = 512;
  return o;
}

// From another thread: kills this process as soon as a shard server holds
// pushes of `step` of `job`, staged or applied (the step is being pushed),
// or after 10 s.
void KillWhenPushed(const std::string& coordinator, const std::string& job, int64_t step) {
  std::thread([coordinator, job, step] {
    auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
    v1::GetJobRequest get;
    get.set_job_id(job);
    v1::JobInfo info;
    std::set<std::string> addresses;
    if (CallUnary(stub.get(), &v1::Coordinator::Stub::GetJob, get, &info, absl::Seconds(5)).ok()) {
      for (const auto& c : info.chunks()) addresses.insert(c.server_address());
    }
    std::vector<std::unique_ptr<v1::ShardServer::Stub>> servers;
    for (const std::string& a : addresses)
      servers.push_back(v1::ShardServer::NewStub(MakeChannel(a)));
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      for (auto& server : servers) {
        v1::ListChunksRequest list;
        list.set_job_id(job);
        v1::ListChunksResponse chunks;
        if (!CallUnary(server.get(), &v1::ShardServer::Stub::ListChunks, list, &chunks,
                       absl::Seconds(5))
                 .ok()) {
          continue;
        }
        for (const auto& c : chunks.chunks()) {
          if (c.applied_step() >= step || (c.applied_step() == step - 1 && c.staged_params() > 0)) {
            kill(getpid(), SIGKILL);
          }
        }
      }
    }
    kill(getpid(), SIGKILL);
  }).detach();
}

// --steps, or the number in --steps_file once that exists.
int64_t LastStep() {
  const std::string path = absl::GetFlag(FLAGS_steps_file);
  int64_t step = 0;
  if (!path.empty() && (std::ifstream(path) >> step)) return step;
  return absl::GetFlag(FLAGS_steps);
}

int Run() {
  auto connected = Client::Connect(Options());
  if (!connected.ok()) {
    std::fprintf(stderr, "elastic_worker: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& client = **connected;
  std::ofstream log(absl::GetFlag(FLAGS_log), std::ios::app);
  const int64_t die_in = absl::GetFlag(FLAGS_die_in_step);
  std::vector<float> w(client.layout().num_params());
  const uint64_t batch_size = absl::GetFlag(FLAGS_samples_per_step);
  GradientFn compute = [&](const MicroBatch& batch, Client& c) -> absl::Status {
    // The watcher of KillWhenPushed polls; a step that outran it ends here,
    // before this worker gives anything to the step after the fatal one.
    if (die_in > 0 && batch.step > die_in) kill(getpid(), SIGKILL);
    if (absl::Status s = c.CopyParams(absl::MakeSpan(w)); !s.ok()) return s;
    std::vector<float> g = testing::SumGradient(w, batch.sample_begin, batch.sample_end);
    // This worker's share of the step ends where Step(GradientFn) ends it.
    const uint64_t share_end = static_cast<uint64_t>(batch.step - 1) * batch_size +
                               batch_size * (c.rank() + 1) / c.world_size();
    if (!absl::GetFlag(FLAGS_stream) || batch.sample_end != share_end) {
      return c.AccumulateGradients(g);
    }
    for (size_t t = c.layout().tensors().size(); t-- > 0;) {
      FlatRange r = c.layout().tensor_range(t);
      absl::Status s = c.GradientsReady(r, absl::MakeConstSpan(g).subspan(r.begin, r.size()));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  while (client.step() < LastStep()) {
    if (client.step() + 1 == absl::GetFlag(FLAGS_leave_after_step)) client.AnnounceLeave();
    absl::StatusOr<StepResult> result = client.Step(compute);
    if (!result.ok()) {
      std::fprintf(stderr, "elastic_worker: step %lld: %s\n",
                   static_cast<long long>(client.step() + 1), result.status().ToString().c_str());
      return 1;
    }
    nlohmann::json line = {{"worker", absl::GetFlag(FLAGS_worker_id)},
                           {"pid", getpid()},
                           {"step", result->step},
                           {"generation", result->generation},
                           {"world_size", result->world_size},
                           {"rank", client.rank()},
                           {"sample_begin", result->sample_begin},
                           {"sample_end", result->sample_end},
                           {"attempts", result->attempts},
                           {"unix_ms", absl::ToUnixMillis(absl::Now())}};
    log << line.dump() << std::endl;
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_step_pause_ms)));
    if (result->step == absl::GetFlag(FLAGS_leave_after_step)) {
      absl::Status left = client.Leave();
      if (!left.ok()) std::fprintf(stderr, "elastic_worker: leave: %s\n", left.ToString().c_str());
      return left.ok() ? 0 : 1;
    }
    if (result->step == absl::GetFlag(FLAGS_die_after_step)) kill(getpid(), SIGKILL);
    // Watch the servers from a few steps before, to catch the fatal one in time.
    if (die_in > 0 && result->step == std::max<int64_t>(die_in - 5, 1)) {
      KillWhenPushed(absl::GetFlag(FLAGS_coordinator), absl::GetFlag(FLAGS_job), die_in);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  strata::InitCommandLine(argc, argv,
                          "elastic_worker: a test worker of an elastic strata job (see the "
                          "source for its role in tests/integration/elastic_test.cc).");
  return strata::Run();
}
