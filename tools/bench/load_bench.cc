#include "tools/bench/load_bench.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "core/subprocess.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/rendezvous_keys.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "tools/bench/bench_util.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr uint64_t kServerHostBudgetBytes = uint64_t{256} << 20;
constexpr uint64_t kJobParams = 4096;
constexpr absl::Duration kRpcDeadline = absl::Seconds(10);

// A daemon started as a process; SIGTERM and waited for when destroyed.
struct Daemon {
  pid_t pid = -1;
  std::string address;
  ~Daemon() {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
  // Peak resident memory (VmHWM) in bytes; 0 when unreadable.
  uint64_t PeakRssBytes() const { return strata::PeakRssBytes(pid); }
};

absl::Status Start(Daemon* daemon, std::vector<std::string> args, const std::string& dir,
                   const std::string& name) {
  const std::string ready = absl::StrCat(dir, "/", name, ".addr");
  args.push_back("--ready_file=" + ready);
  ASSIGN_OR_RETURN(daemon->pid, SpawnProcess(args, absl::StrCat(dir, "/", name, ".log")));
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    std::ifstream in(ready);
    if (std::getline(in, daemon->address) && !daemon->address.empty()) return absl::OkStatus();
    if (waitpid(daemon->pid, nullptr, WNOHANG) == daemon->pid) {
      daemon->pid = -1;
      return absl::InternalError(absl::StrCat(name, " exited at start-up; see ", dir));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, " did not start in 30 s; see ", dir));
}

// Latencies by RPC, and the errors seen, of one client thread.
struct Tally {
  std::map<std::string, std::vector<double>> ms;
  uint64_t unexpected = 0;
  uint64_t refused = 0;  // bad requests refused with their expected code
  std::string first_unexpected;

  // Times `call` as `rpc`; `expect` is the code it must end with.
  void Time(const std::string& rpc, absl::StatusCode expect,
            const std::function<absl::Status()>& call) {
    const absl::Time started = absl::Now();
    const absl::Status s = call();
    ms[rpc].push_back(absl::ToDoubleMilliseconds(absl::Now() - started));
    if (s.code() == expect) {
      if (expect != absl::StatusCode::kOk) ++refused;
      return;
    }
    if (unexpected++ == 0) first_unexpected = absl::StrCat(rpc, ": ", s.ToString());
  }
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

template <typename Stub, typename Request, typename Response>
absl::Status Unary(Stub* stub,
                   grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                   const Request& request) {
  Response response;
  return CallUnary(stub, method, request, &response, kRpcDeadline);
}

std::string JobOf(int client) { return absl::StrCat("load-", client / 5 * 5); }

// The calls of the clients that are not trainers, by kind (client % 5).
class RawClient {
 public:
  RawClient(int client, const std::string& coordinator, const std::string& server)
      : client_(client),
        job_(JobOf(client)),
        coordinator_(v1::Coordinator::NewStub(MakeChannel(coordinator))),
        server_(v1::ShardServer::NewStub(MakeChannel(server))) {}

  void Once(Tally* t, int64_t n) {
    using C = v1::Coordinator::Stub;
    switch (client_ % 5) {
      case 1: {  // a watch of the job's generations, 1 s at a time
        t->Time("WatchGeneration", absl::StatusCode::kDeadlineExceeded, [&] {
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
          v1::WatchGenerationRequest r;
          r.set_job_id(job_);
          auto reader = coordinator_->WatchGeneration(&context, r);
          v1::Generation generation;
          while (reader->Read(&generation)) {
          }
          return FromGrpcStatus(reader->Finish());
        });
        break;
      }
      case 2: {  // rendezvous keys of the job (16 of them, 1 KiB values)
        const std::string key = absl::StrCat(RendezvousPrefix(job_), "load/", client_, "-", n % 16);
        v1::KvSetRequest set;
        set.set_key(key);
        set.set_value(std::string(1024, 'v'));
        t->Time("KvSet", absl::StatusCode::kOk,
                [&] { return Unary(coordinator_.get(), &C::KvSet, set); });
        v1::KvGetRequest get;
        get.set_key(key);
        t->Time("KvGet", absl::StatusCode::kOk,
                [&] { return Unary(coordinator_.get(), &C::KvGet, get); });
        break;
      }
      case 3: {  // what operators and launchers read
        v1::GetPlacementRequest placement;
        placement.set_job_id(job_);
        t->Time("GetPlacement", absl::StatusCode::kOk,
                [&] { return Unary(coordinator_.get(), &C::GetPlacement, placement); });
        v1::GetJobRequest get;
        get.set_job_id(job_);
        t->Time("GetJob", absl::StatusCode::kOk,
                [&] { return Unary(coordinator_.get(), &C::GetJob, get); });
        v1::ListMembersRequest members;
        members.set_job_id(job_);
        t->Time("ListMembers", absl::StatusCode::kOk,
                [&] { return Unary(coordinator_.get(), &C::ListMembers, members); });
        v1::ListChunksRequest chunks;
        chunks.set_job_id(job_);
        t->Time("ListChunks", absl::StatusCode::kOk,
                [&] { return Unary(server_.get(), &v1::ShardServer::Stub::ListChunks, chunks); });
        break;
      }
      case 4:  // bad requests, each refused with its code
        Bad(t, n);
        break;
    }
  }

 private:
  void Bad(Tally* t, int64_t n) {
    using C = v1::Coordinator::Stub;
    switch (n % 5) {
      case 0: {
        v1::GetJobRequest r;
        r.set_job_id("no-such-job");
        t->Time("bad:GetJob", absl::StatusCode::kNotFound,
                [&] { return Unary(coordinator_.get(), &C::GetJob, r); });
        break;
      }
      case 1: {
        v1::SaveCheckpointRequest r;
        r.set_job_id(job_);
        r.set_dir("/etc/../etc");
        t->Time("bad:SaveCheckpoint", absl::StatusCode::kInvalidArgument,
                [&] { return Unary(coordinator_.get(), &C::SaveCheckpoint, r); });
        break;
      }
      case 2: {
        v1::KvSetRequest r;
        r.set_key("not-a-job-key");
        r.set_value("x");
        t->Time("bad:KvSet", absl::StatusCode::kInvalidArgument,
                [&] { return Unary(coordinator_.get(), &C::KvSet, r); });
        break;
      }
      case 3: {
        v1::CreateJobRequest r;
        r.mutable_spec()->set_job_id("huge");
        auto* tensor = r.mutable_spec()->add_tensors();
        tensor->set_name("w");
        tensor->add_shape(int64_t{1} << 40);
        tensor->add_shape(int64_t{1} << 40);
        r.mutable_spec()->set_world_size(1);
        r.mutable_spec()->set_chunk_num_params(64);
        t->Time("bad:CreateJob", absl::StatusCode::kInvalidArgument,
                [&] { return Unary(coordinator_.get(), &C::CreateJob, r); });
        break;
      }
      case 4: {
        v1::PushRequest r;
        r.set_job_id("no-such-job");
        r.set_step(1);
        r.set_num_params(64);
        r.set_dtype(v1::DTYPE_FP16);
        r.set_coef(1.0f);
        r.set_grads(std::string(128, '\0'));
        t->Time("bad:Push", absl::StatusCode::kNotFound,
                [&] { return Unary(server_.get(), &v1::ShardServer::Stub::Push, r); });
        break;
      }
    }
  }

  const int client_;
  const std::string job_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<v1::ShardServer::Stub> server_;
};

ClientOptions TrainerOptions(const std::string& coordinator, int client) {
  ClientOptions o;
  o.coordinator_address = coordinator;
  o.job_id = JobOf(client);
  o.worker_id = "trainer";
  o.job.world_size = 1;
  o.job.tensors = {{"w", {static_cast<int64_t>(kJobParams)}}};
  o.job.chunk_num_params = 1024;
  o.job.dtype = DType::kFp16;
  return o;
}

// Runs every client for `duration` (trainers first: the others use their
// jobs); returns the tallies.
std::vector<Tally> Drive(const LoadBenchOptions& options, const std::string& coordinator,
                         const std::vector<std::string>& servers, absl::Status* failed) {
  const int n = options.clients;
  std::vector<Tally> tallies(n);
  std::vector<std::unique_ptr<Client>> trainers(n);
  {
    std::vector<std::thread> connecting;
    for (int c = 0; c < n; c += 5) {
      connecting.emplace_back([&, c] {
        auto client = Client::Connect(TrainerOptions(coordinator, c));
        if (client.ok()) trainers[c] = *std::move(client);
        if (!client.ok() && tallies[c].unexpected++ == 0) {
          tallies[c].first_unexpected = "Connect: " + client.status().ToString();
        }
      });
    }
    for (auto& t : connecting) t.join();
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < n; ++c) {
    threads.emplace_back([&, c] {
      Tally& t = tallies[c];
      if (c % 5 == 0) {
        if (trainers[c] == nullptr) return;
        const std::vector<float> grads(kJobParams, 1e-3f);
        while (!stop.load()) {
          t.Time("step", absl::StatusCode::kOk, [&] {
            absl::Status s = trainers[c]->AccumulateGradients(grads);
            return s.ok() ? trainers[c]->Step().status() : s;
          });
        }
        return;
      }
      RawClient raw(c, coordinator, servers[c % servers.size()]);
      for (int64_t i = 0; !stop.load(); ++i) raw.Once(&t, i);
    });
  }
  absl::SleepFor(options.duration);
  stop = true;
  for (auto& t : threads) t.join();
  for (auto& trainer : trainers) {
    if (trainer != nullptr && !trainer->Leave().ok()) *failed = absl::InternalError("leave");
  }
  return tallies;
}

// Starts a coordinator and two shard servers of kServerHostBudgetBytes in `dir`.
absl::Status StartCluster(const std::string& dir, Daemon* coordinator,
                          std::vector<std::unique_ptr<Daemon>>* servers) {
  const std::string bin = BinDir();
  RETURN_IF_ERROR(Start(coordinator,
                        {bin + "/strata-coordinator", "--listen=127.0.0.1:0",
                         "--data_dir=" + dir + "/coordinator", "--checkpoint_dir=" + dir},
                        dir, "coordinator"));
  for (int i = 0; i < 2; ++i) {
    servers->push_back(std::make_unique<Daemon>());
    RETURN_IF_ERROR(Start(
        servers->back().get(),
        {bin + "/strata-server", "--listen=127.0.0.1:0", "--coordinator=" + coordinator->address,
         absl::StrCat("--data_dir=", dir, "/server", i), "--checkpoint_root=" + dir,
         absl::StrCat("--host_budget_mib=", kServerHostBudgetBytes >> 20),
         "--pin_host_memory=false"},
        dir, absl::StrCat("server", i)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> BenchLoad(const LoadBenchOptions& options) {
  if (options.clients < 5 || options.clients > 1000) {
    return absl::InvalidArgumentError("--clients must be in [5, 1000]");
  }
  char pattern[] = "/tmp/strata-load-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = pattern;
  auto coordinator = std::make_unique<Daemon>();
  std::vector<std::unique_ptr<Daemon>> servers;
  RETURN_IF_ERROR(StartCluster(dir, coordinator.get(), &servers));
  std::vector<std::string> server_addresses;
  for (const auto& s : servers) server_addresses.push_back(s->address);

  // The idle cluster: one client of each kind, one after the other.
  LoadBenchOptions idle_options{5, absl::Seconds(3)};
  absl::Status failed;
  std::vector<Tally> idle = Drive(idle_options, coordinator->address, server_addresses, &failed);
  std::vector<Tally> loaded = Drive(options, coordinator->address, server_addresses, &failed);
  if (!failed.ok()) return failed;

  std::map<std::string, std::vector<double>> idle_ms, loaded_ms;
  for (const Tally& t : idle) {
    for (const auto& [rpc, ms] : t.ms)
      idle_ms[rpc].insert(idle_ms[rpc].end(), ms.begin(), ms.end());
  }
  uint64_t unexpected = 0, refused = 0;
  std::string first_unexpected;
  for (const Tally& t : loaded) {
    for (const auto& [rpc, ms] : t.ms) {
      loaded_ms[rpc].insert(loaded_ms[rpc].end(), ms.begin(), ms.end());
    }
    unexpected += t.unexpected;
    refused += t.refused;
    if (first_unexpected.empty()) first_unexpected = t.first_unexpected;
  }
  json rpcs = json::object();
  for (const auto& [rpc, ms] : loaded_ms) {
    rpcs[rpc] = {{"calls", ms.size()},
                 {"p50_ms", Percentile(ms, 0.5)},
                 {"p99_ms", Percentile(ms, 0.99)},
                 {"idle_p50_ms", Percentile(idle_ms[rpc], 0.5)}};
  }
  json rss = json::object();
  bool within = true;
  auto note_rss = [&](const std::string& name, const Daemon& d, uint64_t budget) {
    const uint64_t peak = d.PeakRssBytes();
    const uint64_t bound = budget + kDaemonOverheadBytes;
    rss[name] = {{"peak_mib", peak >> 20},
                 {"bound_mib", bound >> 20},
                 {"of_bound", static_cast<double>(peak) / bound}};
    within = within && peak <= bound;
  };
  note_rss("coordinator", *coordinator, 0);
  for (size_t i = 0; i < servers.size(); ++i) {
    note_rss(absl::StrCat("server", i), *servers[i], kServerHostBudgetBytes);
  }
  servers.clear();
  coordinator.reset();
  std::filesystem::remove_all(dir);
  return json{{"bench", "load"},
              {"clients", options.clients},
              {"seconds", absl::ToDoubleSeconds(options.duration)},
              {"rpcs", rpcs},
              {"bad_requests_refused", refused},
              {"unexpected_errors", unexpected},
              {"first_unexpected_error", first_unexpected},
              {"peak_rss", rss},
              {"ok", unexpected == 0 && within}};
}

}  // namespace strata
