#include "coordinator/server_monitor.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "core/log.h"
#include "rpc/grpc_util.h"

namespace strata {

ServerMonitor::ServerMonitor(absl::Duration interval, absl::Duration timeout,
                             ChannelCredentials credentials, Reachability* reachability,
                             Callback on_lost, Callback on_back, std::function<void()> on_round)
    : interval_(interval),
      timeout_(timeout),
      credentials_(std::move(credentials)),
      reachability_(reachability),
      on_lost_(std::move(on_lost)),
      on_back_(std::move(on_back)),
      on_round_(std::move(on_round)),
      thread_([this] { Loop(); }) {}

ServerMonitor::~ServerMonitor() { Stop(); }

void ServerMonitor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ServerMonitor::Watch(const std::string& address) {
  absl::MutexLock lock(&mu_);
  Server& server = servers_[address];
  if (server.stub == nullptr) {
    server.stub = grpc::health::v1::Health::NewStub(MakeChannel(address, credentials_));
  }
  server.last_healthy = absl::Now();
  server.lost = false;
}

bool ServerMonitor::IsLost(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  auto it = servers_.find(address);
  return it != servers_.end() && it->second.lost;
}

void ServerMonitor::CheckAll(std::vector<std::string>* lost, std::vector<std::string>* back) {
  std::vector<std::pair<std::string, grpc::health::v1::Health::Stub*>> targets;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (!reachability_->HeardAfter(now - timeout_ / 2)) {
      if (!isolated_ && !servers_.empty()) {
        LogEventCat("coordinator",
                    "hears from no worker or shard server: declares no server lost "
                    "until it does");
      }
      isolated_ = true;
    } else if (isolated_) {
      isolated_ = false;
      for (auto& [address, server] : servers_) server.last_healthy = now;
    }
    for (const auto& [address, server] : servers_) targets.emplace_back(address, server.stub.get());
  }
  const absl::Duration deadline = std::min(interval_, absl::Seconds(1));
  for (const auto& [address, stub] : targets) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    const bool healthy = stub->Check(&context, request, &response).ok() &&
                         response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    absl::MutexLock lock(&mu_);
    Server& server = servers_[address];
    const absl::Time now = absl::Now();
    if (healthy) {
      reachability_->Heard();
      server.last_healthy = now;
      if (server.lost) back->push_back(address);
      server.lost = false;
    } else if (!isolated_ && now - server.last_healthy > timeout_) {
      if (!server.lost) {
        LogEventCat("coordinator", "shard server ", address, " is lost: no healthy answer for ",
                    absl::FormatDuration(now - server.last_healthy));
      }
      server.lost = true;
      lost->push_back(address);
    }
  }
}

void ServerMonitor::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), interval_);
      if (stopping_) return;
    }
    std::vector<std::string> lost, back;
    CheckAll(&lost, &back);
    for (const std::string& address : back) on_back_(address);
    for (const std::string& address : lost) {
      if (IsLost(address)) on_lost_(address);
    }
    on_round_();
  }
}

}  // namespace strata
