#include "rpc/metrics.h"

#include <grpcpp/support/status_code_enum.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace strata {
namespace {

const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "UNKNOWN";
}

// Counts one RPC when its status is sent, with the time since it arrived.
class RpcInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(std::string method, prometheus::Family<prometheus::Counter>* rpcs,
                 prometheus::Family<prometheus::Histogram>* seconds)
      : method_(std::move(method)), rpcs_(rpcs), seconds_(seconds), started_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = methods->GetSendStatus();
      rpcs_->Add({{"method", method_}, {"code", CodeName(status.error_code())}}).Increment();
      seconds_
          ->Add({{"method", method_}},
                prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 1e-2, 0.1, 0.5, 1, 5, 30})
          .Observe(absl::ToDoubleSeconds(absl::Now() - started_));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  prometheus::Family<prometheus::Counter>* const rpcs_;
  prometheus::Family<prometheus::Histogram>* const seconds_;
  const absl::Time started_;
};

class RpcInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcInterceptorFactory(prometheus::Family<prometheus::Counter>* rpcs,
                        prometheus::Family<prometheus::Histogram>* seconds)
      : rpcs_(rpcs), seconds_(seconds) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(info->method(), rpcs_, seconds_);
  }

 private:
  prometheus::Family<prometheus::Counter>* const rpcs_;
  prometheus::Family<prometheus::Histogram>* const seconds_;
};

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpcs_(&prometheus::BuildCounter()
                 .Name("strata_rpcs_total")
                 .Help("RPCs served, by method and gRPC status code")
                 .Register(*registry_)),
      rpc_seconds_(&prometheus::BuildHistogram()
                        .Name("strata_rpc_seconds")
                        .Help("Time from an RPC's arrival to its status (a push: until its "
                              "chunk applied the step)")
                        .Register(*registry_)) {}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen_address) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  if (listen_address.empty()) return metrics;
  try {
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(listen_address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen_address, ": ", e.what()));
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  std::vector<int> ports = metrics->exposer_->GetListeningPorts();
  std::string host = listen_address.substr(0, listen_address.rfind(':'));
  metrics->address_ = absl::StrCat(host, ":", ports.empty() ? 0 : ports[0]);
  return metrics;
}

void Metrics::Register(const std::weak_ptr<prometheus::Collectable>& collectable) {
  if (exposer_ != nullptr) exposer_->RegisterCollectable(collectable);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
Metrics::RpcInterceptorFactory() {
  return std::make_unique<strata::RpcInterceptorFactory>(rpcs_, rpc_seconds_);
}

prometheus::MetricFamily ValueFamily(
    prometheus::MetricType type, const std::string& name, const std::string& help,
    const std::vector<std::pair<prometheus::Labels, double>>& values) {
  prometheus::MetricFamily family{name, help, type, {}};
  for (const auto& [labels, value] : values) {
    prometheus::ClientMetric metric;
    for (const auto& [k, v] : labels) metric.label.push_back({k, v});
    (type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value) = value;
    family.metric.push_back(std::move(metric));
  }
  return family;
}

}  // namespace strata
