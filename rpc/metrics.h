// Metrics: a daemon's Prometheus registry (prometheus-cpp), served over HTTP
// at /metrics when a listen address is given, and what every daemon exports
// alike: its RPCs by method and status code and their durations, counted by a
// gRPC server interceptor (RpcInterceptorFactory). Daemon-specific values are
// added as Collectables computed at scrape time (ValueFamily helps) or as
// families in registry(). Thread-safe.
#ifndef STRATA_RPC_METRICS_H_
#define STRATA_RPC_METRICS_H_

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

class Metrics {
 public:
  // Serves the registry on `listen_address` (host:port, port 0 picks one);
  // empty: no endpoint (metrics are still counted). UNAVAILABLE naming the
  // address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen_address);

  prometheus::Registry& registry() { return *registry_; }
  // host:port of the endpoint; empty without one.
  const std::string& address() const { return address_; }
  // Serves `collectable` too, for as long as it lives.
  void Register(const std::weak_ptr<prometheus::Collectable>& collectable);
  // Counts and times every RPC of the gRPC server it is installed in.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcInterceptorFactory();

 private:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Family<prometheus::Histogram>* rpc_seconds_;
};

// One gauge or counter family computed at scrape time: a value per label set.
prometheus::MetricFamily ValueFamily(
    prometheus::MetricType type, const std::string& name, const std::string& help,
    const std::vector<std::pair<prometheus::Labels, double>>& values);

// A Collectable that runs a function at every scrape.
class CollectFunction : public prometheus::Collectable {
 public:
  explicit CollectFunction(std::function<std::vector<prometheus::MetricFamily>()> collect)
      : collect_(std::move(collect)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return collect_(); }

 private:
  const std::function<std::vector<prometheus::MetricFamily>()> collect_;
};

}  // namespace strata

#endif  // STRATA_RPC_METRICS_H_
