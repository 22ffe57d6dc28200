#include "coordinator/shard_fleet.h"

#include <grpcpp/channel.h>

#include <algorithm>
#include <utility>

#include "coordinator/job_info.h"
#include "rpc/grpc_util.h"
#include "rpc/token.h"
#include "strata/internal/records.pb.h"

namespace strata {

v1::ShardServer::Stub* ShardFleet::Stub(const std::string& address) {
  absl::MutexLock lock(&mu_);
  Connection& connection = connections_[address];
  if (connection.stub == nullptr) {
    connection.channel = MakeChannel(address, credentials_);
    connection.stub = v1::ShardServer::NewStub(connection.channel);
  }
  return connection.stub.get();
}

void ShardFleet::Reconnect(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(address);
  if (it != connections_.end()) {
    grpc::experimental::ChannelResetConnectionBackoff(it->second.channel.get());
  }
}

template <typename Request, typename Response>
void ShardFleet::CallEach(
    const std::vector<std::string>& addresses, bool wait_for_ready,
    AsyncMethod<Request, Response> method, std::function<void(const std::string&, Request*)> fill,
    std::function<void(std::vector<std::unique_ptr<FanOutResult<Response>>>&)> done) {
  FanOut<Response>(
      addresses, call_timeout_,
      [this, wait_for_ready, method, fill = std::move(fill)](
          const std::string& address, grpc::ClientContext* context, Response* out,
          std::function<void(grpc::Status)> on_reply) {
        context->set_wait_for_ready(wait_for_ready);
        auto request = std::make_shared<Request>();
        fill(address, request.get());
        (Stub(address)->async()->*method)(
            context, request.get(), out,
            [request, on_reply = std::move(on_reply)](grpc::Status s) { on_reply(std::move(s)); });
      },
      std::move(done));
}

void ShardFleet::Allocate(std::shared_ptr<const v1::JobInfo> job, uint64_t min_generation,
                          Absent absent,
                          std::function<void(absl::Status, std::vector<std::string>)> done,
                          std::shared_ptr<const SeededChunks> seeded) {
  CallEach<v1::AllocateChunksRequest, v1::AllocateChunksResponse>(
      ServersOf(*job), /*wait_for_ready=*/false,
      &v1::ShardServer::StubInterface::async_interface::AllocateChunks,
      [job, min_generation, absent, seeded](const std::string& address,
                                            v1::AllocateChunksRequest* allocate) {
        *allocate->mutable_spec() = job->spec();
        for (const v1::ChunkSpec& c : ChunksOn(*job, address)) *allocate->add_chunks() = c;
        allocate->set_min_generation(min_generation);
        allocate->set_chunks_held(absent == Absent::kRefuse);
        allocate->set_loads_checkpoint(absent == Absent::kMakeAnewToLoad);
        if (seeded != nullptr) {
          if (auto it = seeded->find(address); it != seeded->end()) {
            allocate->mutable_seeded_chunk_ids()->Assign(it->second.begin(), it->second.end());
          }
        }
        if (!job->worker_token().empty()) {
          allocate->set_worker_token_sha256(TokenDigest(job->worker_token()));
        }
      },
      [done = std::move(done)](auto& results) {
        absl::Status status;
        std::vector<std::string> allocated;
        for (auto& r : results) {
          status.Update(r->status);
          if (r->status.ok()) allocated.push_back(r->address);
        }
        done(status, std::move(allocated));
      });
}

void ShardFleet::Load(std::shared_ptr<const v1::JobInfo> job,
                      std::shared_ptr<const internal::CheckpointManifest> manifest,
                      std::function<void(absl::Status)> done) {
  CallEach<v1::LoadChunksRequest, v1::LoadChunksResponse>(
      ServersOf(*job), /*wait_for_ready=*/false,
      &v1::ShardServer::StubInterface::async_interface::LoadChunks,
      [job, manifest](const std::string& address, v1::LoadChunksRequest* load) {
        load->set_job_id(job->spec().job_id());
        load->set_step(manifest->step());
        load->set_dir(job->restored_from());
        load->set_state_precision(manifest->spec().state_precision());
        // The files whose ranges overlap the server's chunks.
        const std::vector<v1::ChunkSpec> chunks = ChunksOn(*job, address);
        for (const v1::CheckpointFile& f : manifest->files()) {
          uint64_t begin = f.chunk().flat_begin(), end = begin + f.chunk().num_params();
          if (std::any_of(chunks.begin(), chunks.end(), [&](const v1::ChunkSpec& c) {
                return begin < c.flat_begin() + c.num_params() && c.flat_begin() < end;
              })) {
            *load->add_files() = f;
          }
        }
      },
      [done = std::move(done)](auto& results) {
        absl::Status status;
        for (auto& r : results) status.Update(r->status);
        done(status);
      });
}

void ShardFleet::Drop(const std::string& job_id, const std::vector<std::string>& addresses,
                      bool wait_for_ready, std::function<void(std::vector<std::string>)> done) {
  CallEach<v1::DropJobRequest, v1::DropJobResponse>(
      addresses, wait_for_ready, &v1::ShardServer::StubInterface::async_interface::DropJob,
      [job_id](const std::string&, v1::DropJobRequest* drop) { drop->set_job_id(job_id); },
      [done = std::move(done)](auto& results) {
        std::vector<std::string> failed;
        for (auto& r : results) {
          if (!r->status.ok() && !absl::IsNotFound(r->status)) failed.push_back(r->address);
        }
        done(std::move(failed));
      });
}

void ShardFleet::ListChunks(
    const std::vector<std::string>& addresses, const std::string& job_id, bool wait_for_ready,
    std::function<void(std::vector<std::unique_ptr<FanOutResult<v1::ListChunksResponse>>>&)> done) {
  CallEach<v1::ListChunksRequest, v1::ListChunksResponse>(
      addresses, wait_for_ready, &v1::ShardServer::StubInterface::async_interface::ListChunks,
      [job_id](const std::string&, v1::ListChunksRequest* list) { list->set_job_id(job_id); },
      std::move(done));
}

}  // namespace strata
