// stratactl: inspect a strata cluster. See --help.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/shard_transport.h"
#include "core/command_line.h"
#include "core/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "rpc/job_spec.h"
#include "rpc/tls_flags.h"
#include "rpc/token.h"
#include "strata/client.h"
#include "strata/flat_layout.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/shard.grpc.pb.h"
#include "tools/ctl_views.h"
#include "tools/model_export.h"
#include "tools/placement_view.h"
#include "tools/table.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7700", "host:port of strata-coordinator");
ABSL_FLAG(std::string, job, "", "job id (placement: every job when empty)");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(int, timeout_s, 10, "RPC deadline in seconds");
ABSL_FLAG(std::string, target, "",
          "health: host:port of the daemon to check (default: --coordinator)");
ABSL_FLAG(std::string, out, "", "export: the directory to write model.safetensors into");
ABSL_FLAG(std::string, dir, "",
          "checkpoint: the directory of the job's checkpoints (default: the job's, else the "
          "coordinator's --checkpoint_dir)");
ABSL_FLAG(std::string, token_file, "",
          "where the cluster authenticates callers: a file holding your user's or operator's "
          "token (or a job's worker token); needs --tls_ca");
ABSL_FLAG(bool, with_optimizer_state, false,
          "export: also write each tensor's Adam moments, as NAME.exp_avg and NAME.exp_avg_sq");
ABSL_FLAG(bool, cancel, false, "server drain: the server takes chunks again");
ABSL_FLAG(std::string, service, "",
          "health: the service to check, e.g. strata.v1.ShardServer (default: the whole server)");

namespace strata {
namespace {

using nlohmann::json;

constexpr char kUsage[] =
    "stratactl: inspect a strata cluster.\n\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] jobs\n"
    "      every job: id, initial world size, members, live generation, last committed\n"
    "      step, params, chunks, dtype (--json: also the samples those steps consumed)\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] [--job=ID] placement\n"
    "      every chunk: job, id, flat range, tensors, server, tier, bytes, applied step,\n"
    "      then per server and tier: chunks, bytes (of the jobs shown) and budget\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] --job=ID members\n"
    "      the job's generation, then its workers: rank in it (- for a worker not in it\n"
    "      yet), worker id, address, generation it runs in, last heartbeat, last\n"
    "      completed step, steps taken since it joined, joined at\n"
    "  stratactl [--coordinator=HOST:PORT] --job=ID --out=DIR [--with_optimizer_state] export\n"
    "      writes the job's FP32 master weights (and Adam moments) at one step to\n"
    "      DIR/model.safetensors, per tensor with its registered name and shape\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] --job=ID job delete\n"
    "      deletes a job whose workers have all left: its chunks on every shard server\n"
    "      (a server that does not answer drops them when it registers again; they\n"
    "      are listed); its checkpoints stay\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] --job=ID [--dir=DIR] checkpoint save\n"
    "      saves a consistent checkpoint (every chunk at one step, the newest applied)\n"
    "      into DIR/ID/step-N without stopping training; waits up to an hour\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] --job=ID [--dir=DIR] checkpoint list\n"
    "      the job's complete checkpoints, oldest first: step, path, bytes, files,\n"
    "      created, seconds of the save and of its writing (start a job from one with\n"
    "      ClientOptions::initial.checkpoint)\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] [--cancel] server drain ADDRESS\n"
    "      moves every chunk copy off the shard server while its jobs train (the\n"
    "      copies are built beside the training; each job then waits, between two\n"
    "      steps, while they catch up: no step lost or recomputed), keeping each\n"
    "      chunk's copies; the server then takes no new chunks and can leave\n"
    "      (--cancel: it takes chunks again); waits until done\n"
    "  stratactl [--coordinator=HOST:PORT] [--json] --job=ID job rebalance\n"
    "      spreads the job's chunk copies over the live servers, balanced by bytes\n"
    "      (e.g. onto a server that registered since), while it trains\n"
    "  stratactl [--target=HOST:PORT] [--service=NAME] [--json] health\n"
    "      the standard gRPC health check (grpc.health.v1) of a coordinator or shard\n"
    "      server; exits 0 when it is SERVING, 1 otherwise (for container health checks)\n"
    "With TLS on the daemons, every command takes --tls_ca=FILE (their CA) and, where\n"
    "they ask for one, --tls_cert=FILE --tls_key=FILE; with authentication on,\n"
    "--token_file=FILE (your user's or operator's token).\n"
    "The environment gives what the command line does not (the names strata.launch\n"
    "passes to workers): STRATA_COORDINATOR (--coordinator), STRATA_JOB (--job),\n"
    "STRATA_TLS_CA, STRATA_TLS_CERT, STRATA_TLS_KEY (--tls_ca, --tls_cert, --tls_key)\n"
    "and STRATA_TOKEN_FILE (--token_file).";

constexpr EnvironmentFlag kFlagsFromEnvironment[] = {
    {"coordinator", "STRATA_COORDINATOR"}, {"job", "STRATA_JOB"},
    {"tls_ca", "STRATA_TLS_CA"},           {"tls_cert", "STRATA_TLS_CERT"},
    {"tls_key", "STRATA_TLS_KEY"},         {"token_file", "STRATA_TOKEN_FILE"},
};

// The channel credentials of the --tls_* flags and --token_file; exits with
// the error when they are unusable.
const ChannelCredentials& Credentials() {
  static const ChannelCredentials* credentials = [] {
    absl::StatusOr<ChannelCredentials> made = []() -> absl::StatusOr<ChannelCredentials> {
      std::string token;
      if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
        ASSIGN_OR_RETURN(token, ReadTokenFile(file, "--token_file"));
      }
      return MakeChannelCredentials(TlsFilesFromFlags(), token);
    }();
    if (!made.ok()) {
      std::fprintf(stderr, "stratactl: %s\n", std::string(made.status().message()).c_str());
      std::exit(2);
    }
    return new ChannelCredentials(*std::move(made));
  }();
  return *credentials;
}

class Ctl {
 public:
  Ctl()
      : stub_(v1::Coordinator::NewStub(
            MakeChannel(absl::GetFlag(FLAGS_coordinator), Credentials()))) {}

  template <typename Request, typename Response, typename Method>
  absl::Status Call(Method method, const Request& request, Response* response) {
    return CallUnary(stub_.get(), method, request, response,
                     absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  }

  absl::Status Jobs() {
    v1::ListJobsResponse response;
    absl::Status s = Call(&v1::Coordinator::Stub::ListJobs, v1::ListJobsRequest(), &response);
    if (!s.ok()) return s;
    json out = json::array();
    Table table({"JOB", "WORLD", "MEMBERS", "GENERATION", "STEP", "PARAMS", "CHUNKS",
                 "CHUNK_PARAMS", "DTYPE"});
    for (const auto& summary : response.jobs()) {
      const v1::JobInfo& job = summary.job();
      std::string dtype = v1::DType_Name(job.spec().dtype());
      out.push_back({{"job", job.spec().job_id()},
                     {"world_size", job.spec().world_size()},
                     {"members", summary.num_members()},
                     {"generation", summary.generation()},
                     {"committed_step", summary.committed_step()},
                     {"samples_consumed", summary.samples_consumed()},
                     {"params", job.flat_num_params()},
                     {"chunks", job.chunks_size()},
                     {"chunk_params", job.spec().chunk_num_params()},
                     {"dtype", dtype}});
      table.Add({job.spec().job_id(), absl::StrCat(job.spec().world_size()),
                 absl::StrCat(summary.num_members()), absl::StrCat(summary.generation()),
                 absl::StrCat(summary.committed_step()), absl::StrCat(job.flat_num_params()),
                 absl::StrCat(job.chunks_size()), absl::StrCat(job.spec().chunk_num_params()),
                 dtype});
    }
    Emit(out, table);
    return absl::OkStatus();
  }

  absl::Status Placement() {
    std::vector<std::string> job_ids;
    if (!absl::GetFlag(FLAGS_job).empty()) {
      job_ids.push_back(absl::GetFlag(FLAGS_job));
    } else {
      v1::ListJobsResponse jobs;
      absl::Status s = Call(&v1::Coordinator::Stub::ListJobs, v1::ListJobsRequest(), &jobs);
      if (!s.ok()) return s;
      for (const auto& summary : jobs.jobs()) job_ids.push_back(summary.job().spec().job_id());
    }
    PlacementView view;
    for (const std::string& id : job_ids) {
      v1::GetPlacementRequest request;
      request.set_job_id(id);
      v1::GetPlacementResponse response;
      absl::Status s = Call(&v1::Coordinator::Stub::GetPlacement, request, &response);
      if (!s.ok()) return s;
      if (response.moving()) {
        std::fprintf(stderr, "job %s: its chunks are moving; these rows are the old placement's\n",
                     id.c_str());
      }
      view.Add(response);
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", view.rows_json().dump().c_str());
    } else {
      view.Print(stdout);
    }
    return absl::OkStatus();
  }

  absl::Status DeleteJob() {
    const std::string job_id = absl::GetFlag(FLAGS_job);
    if (job_id.empty()) return absl::InvalidArgumentError("job delete needs --job");
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    v1::DeleteJobResponse response;
    if (absl::Status s = Call(&v1::Coordinator::Stub::DeleteJob, request, &response); !s.ok()) {
      return s;
    }
    const std::vector<std::string> unreachable(response.unreachable_servers().begin(),
                                               response.unreachable_servers().end());
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n",
                  json{{"job", job_id}, {"unreachable_servers", unreachable}}.dump().c_str());
    } else if (unreachable.empty()) {
      std::printf("job %s deleted\n", job_id.c_str());
    } else {
      std::printf("job %s deleted; %s did not answer and will drop it when registering again\n",
                  job_id.c_str(), absl::StrJoin(unreachable, ", ").c_str());
    }
    return absl::OkStatus();
  }

  absl::Status Export() {
    const std::string job_id = absl::GetFlag(FLAGS_job);
    const std::string dir = absl::GetFlag(FLAGS_out);
    if (job_id.empty() || dir.empty())
      return absl::InvalidArgumentError("export needs --job and --out");
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::JobInfo job;
    if (absl::Status s = Call(&v1::Coordinator::Stub::GetJob, get, &job); !s.ok()) return s;
    absl::StatusOr<FlatLayout> layout =
        FlatLayout::Create(TensorsFromProto(job.spec()), job.spec().chunk_num_params());
    if (!layout.ok()) return layout.status();
    absl::StatusOr<DType> dtype = DTypeFromProto(job.spec().dtype());
    if (!dtype.ok()) return dtype.status();
    ShardTransport transport(job_id, &*layout, *dtype, TlsFilesFromFlags());
    if (absl::Status s = transport.SetPlacement(job); !s.ok()) return s;
    absl::StatusOr<MasterState> state =
        transport.ReadMasterState(absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!state.ok()) return state.status();

    const bool moments = absl::GetFlag(FLAGS_with_optimizer_state);
    ASSIGN_OR_RETURN(ExportedModel exported,
                     ExportModel(job.spec(), *layout, *state, dir, moments));
    json out = {{"job", job_id},
                {"step", state->step},
                {"file", exported.path},
                {"tensors", exported.num_tensors},
                {"with_optimizer_state", moments}};
    std::printf("%s\n",
                absl::GetFlag(FLAGS_json)
                    ? out.dump().c_str()
                    : absl::StrCat("exported job ", job_id, " at step ", state->step, " to ",
                                   exported.path, " (", exported.num_tensors, " tensors)")
                          .c_str());
    return absl::OkStatus();
  }

  absl::Status Health() {
    std::string target = absl::GetFlag(FLAGS_target);
    if (target.empty()) target = absl::GetFlag(FLAGS_coordinator);
    auto stub = grpc::health::v1::Health::NewStub(MakeChannel(target, Credentials()));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(absl::GetFlag(FLAGS_service));
    grpc::health::v1::HealthCheckResponse response;
    absl::Status s = CallUnary(stub.get(), &grpc::health::v1::Health::Stub::Check, request,
                               &response, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(target, ": ", s.message()));
    std::string status =
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
    std::string service = request.service().empty() ? "(server)" : request.service();
    if (absl::GetFlag(FLAGS_json)) {
      std::printf(
          "%s\n",
          json({{"target", target}, {"service", service}, {"status", status}}).dump().c_str());
    } else {
      std::printf("%s %s %s\n", target.c_str(), service.c_str(), status.c_str());
    }
    if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::UnavailableError(absl::StrCat(target, " ", service, " is ", status));
    }
    return absl::OkStatus();
  }

  absl::Status Members() {
    if (absl::GetFlag(FLAGS_job).empty()) return absl::InvalidArgumentError("members needs --job");
    v1::ListMembersRequest request;
    request.set_job_id(absl::GetFlag(FLAGS_job));
    v1::ListMembersResponse response;
    absl::Status s = Call(&v1::Coordinator::Stub::ListMembers, request, &response);
    if (!s.ok()) return s;
    json workers = json::array();
    Table table(
        {"RANK", "WORKER", "ADDRESS", "GENERATION", "HEARTBEAT", "STEP", "STEPS_TAKEN", "JOINED"});
    auto time = [](int64_t unix_ms) {
      if (unix_ms == 0) return std::string("-");
      return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                              absl::UTCTimeZone());
    };
    for (const v1::Member& m : response.members()) {
      std::string rank = m.in_generation() ? absl::StrCat(m.rank()) : "-";
      workers.push_back({{"rank", m.in_generation() ? json(m.rank()) : json(nullptr)},
                         {"worker", m.worker_id()},
                         {"address", m.address()},
                         {"generation", m.generation()},
                         {"last_heartbeat", time(m.last_heartbeat_unix_ms())},
                         {"completed_step", m.completed_step()},
                         {"steps_taken", m.steps_taken()},
                         {"joined", time(m.joined_unix_ms())}});
      table.Add({rank, m.worker_id(), m.address(), absl::StrCat(m.generation()),
                 time(m.last_heartbeat_unix_ms()), absl::StrCat(m.completed_step()),
                 absl::StrCat(m.steps_taken()), time(m.joined_unix_ms())});
    }
    if (absl::GetFlag(FLAGS_json)) {
      json out = {{"job", absl::GetFlag(FLAGS_job)},
                  {"generation", response.generation().number()},
                  {"world_size", response.world_size()},
                  {"lease_ms", response.lease_ms()},
                  {"members", workers}};
      std::printf("%s\n", out.dump().c_str());
    } else {
      std::printf("job %s: generation %llu with %u worker(s); lease %lld ms\n",
                  absl::GetFlag(FLAGS_job).c_str(),
                  static_cast<unsigned long long>(response.generation().number()),
                  response.world_size(), static_cast<long long>(response.lease_ms()));
      table.Print(stdout);
    }
    return absl::OkStatus();
  }

  absl::Status SaveCheckpoint() {
    v1::SaveCheckpointRequest request;
    request.set_job_id(absl::GetFlag(FLAGS_job));
    RETURN_IF_ERROR(AbsoluteDir(request.mutable_dir()));
    v1::CheckpointInfo info;
    RETURN_IF_ERROR(CallUnary(stub_.get(), &v1::Coordinator::Stub::SaveCheckpoint, request, &info,
                              LongCallTimeout()));
    EmitCheckpoints({info});
    return absl::OkStatus();
  }

  // `stratactl server drain ADDRESS`; with --cancel the server takes chunks again.
  absl::Status DrainServer(const std::string& address) {
    v1::DrainServerRequest request;
    request.set_address(address);
    request.set_cancel(absl::GetFlag(FLAGS_cancel));
    v1::DrainServerResponse response;
    RETURN_IF_ERROR(CallUnary(stub_.get(), &v1::Coordinator::Stub::DrainServer, request, &response,
                              LongCallTimeout()));
    if (request.cancel()) {
      EmitMoved({{"server", address}, {"draining", false}}, response.moved(), "");
    } else {
      EmitMoved({{"server", address}, {"draining", true}}, response.moved(),
                absl::StrCat("shard server ", address, " holds no chunk now"));
    }
    return absl::OkStatus();
  }

  absl::Status RebalanceJob() {
    v1::RebalanceJobRequest request;
    request.set_job_id(absl::GetFlag(FLAGS_job));
    if (request.job_id().empty()) return absl::InvalidArgumentError("job rebalance needs --job");
    v1::RebalanceJobResponse response;
    RETURN_IF_ERROR(CallUnary(stub_.get(), &v1::Coordinator::Stub::RebalanceJob, request, &response,
                              LongCallTimeout()));
    EmitMoved({{"job", request.job_id()}}, response.moved(),
              absl::StrCat("job ", request.job_id(), " is balanced"));
    return absl::OkStatus();
  }

  absl::Status ListCheckpoints() {
    v1::ListCheckpointsRequest request;
    request.set_job_id(absl::GetFlag(FLAGS_job));
    RETURN_IF_ERROR(AbsoluteDir(request.mutable_dir()));
    v1::ListCheckpointsResponse response;
    RETURN_IF_ERROR(Call(&v1::Coordinator::Stub::ListCheckpoints, request, &response));
    EmitCheckpoints({response.checkpoints().begin(), response.checkpoints().end()});
    return absl::OkStatus();
  }

 private:
  // The deadline of calls that move or save state: an hour, or --timeout_s.
  static absl::Duration LongCallTimeout() {
    return std::max(absl::Hours(1), absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  }

  // Prints what a drain or rebalance moved: `out` and `moved` as JSON, or
  // a line ending with `done`.
  static void EmitMoved(json out, const v1::CopiesMoved& moved, const std::string& done) {
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", MovedJson(std::move(out), moved).dump().c_str());
    } else if (done.empty()) {
      std::printf("%s takes chunks again\n", out["server"].get<std::string>().c_str());
    } else {
      std::printf("%s\n", MovedLine(moved, done).c_str());
    }
  }

  // --dir made absolute (the coordinator and servers may run elsewhere).
  static absl::Status AbsoluteDir(std::string* dir) {
    if (absl::GetFlag(FLAGS_job).empty()) return absl::InvalidArgumentError("--job is required");
    if (!absl::GetFlag(FLAGS_dir).empty()) {
      *dir = std::filesystem::absolute(absl::GetFlag(FLAGS_dir)).lexically_normal().string();
    }
    return absl::OkStatus();
  }

  static void EmitCheckpoints(const std::vector<v1::CheckpointInfo>& checkpoints) {
    Emit(CheckpointsJson(checkpoints), CheckpointsTable(checkpoints));
  }

  static void Emit(const json& out, const Table& table) {
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", out.dump().c_str());
    } else {
      table.Print(stdout);
    }
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  std::vector<std::string> args =
      strata::InitCommandLine(argc, argv, strata::kUsage, strata::kFlagsFromEnvironment);
  if (args.size() == 2 && args[0] == "checkpoint" && (args[1] == "save" || args[1] == "list")) {
    strata::Ctl ctl;
    absl::Status s = args[1] == "save" ? ctl.SaveCheckpoint() : ctl.ListCheckpoints();
    if (!s.ok()) {
      std::fprintf(stderr, "stratactl checkpoint %s: %s\n", args[1].c_str(), s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (args.size() == 2 && args[0] == "job" && (args[1] == "delete" || args[1] == "rebalance")) {
    absl::Status s = args[1] == "delete" ? strata::Ctl().DeleteJob() : strata::Ctl().RebalanceJob();
    if (!s.ok()) {
      std::fprintf(stderr, "stratactl job %s: %s\n", args[1].c_str(), s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (args.size() == 3 && args[0] == "server" && args[1] == "drain") {
    absl::Status s = strata::Ctl().DrainServer(args[2]);
    if (!s.ok()) {
      std::fprintf(stderr, "stratactl server drain: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (args.size() != 1) {
    std::fprintf(stderr, "%s\n", strata::kUsage);
    return 2;
  }
  strata::Ctl ctl;
  absl::Status s;
  if (args[0] == "jobs") {
    s = ctl.Jobs();
  } else if (args[0] == "placement") {
    s = ctl.Placement();
  } else if (args[0] == "members") {
    s = ctl.Members();
  } else if (args[0] == "export") {
    s = ctl.Export();
  } else if (args[0] == "health") {
    s = ctl.Health();
  } else {
    std::fprintf(stderr, "stratactl: unknown command '%s'\n\n%s\n", args[0].c_str(),
                 strata::kUsage);
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "stratactl %s: %s\n", args[0].c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}
