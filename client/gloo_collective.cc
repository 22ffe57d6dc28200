// The Gloo implementation of Collective (CPU, TCP pairs). See collective.h.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/collective.h"
#include "client/coordinator_store.h"
#include "kernels/elementwise.h"

namespace strata {
namespace {

void SumFp16(uint16_t* x, const uint16_t* y, size_t n) { AddInPlace(DType::kFp16, y, x, n); }
void SumBf16(uint16_t* x, const uint16_t* y, size_t n) { AddInPlace(DType::kBf16, y, x, n); }

const gloo::ReductionFunction<uint16_t>* ReductionFor(DType dtype) {
  static const auto* fp16 = new gloo::ReductionFunction<uint16_t>(gloo::CUSTOM, &SumFp16);
  static const auto* bf16 = new gloo::ReductionFunction<uint16_t>(gloo::CUSTOM, &SumBf16);
  return dtype == DType::kFp16 ? fp16 : bf16;
}

// Runs `fn`, turning Gloo's exceptions into UNAVAILABLE.
template <typename Fn>
absl::Status Guarded(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo ", what, " failed: ", e.what()));
  }
}

class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status ReduceScatterSum(DType dtype, void* data, size_t num_elements) override {
    if (size() == 1) return absl::OkStatus();
    return Guarded("reduce-scatter", [&] {
      // The algorithm sets up its buffers once per (buffer, size, dtype).
      auto key = std::make_tuple(data, num_elements, dtype);
      auto& algorithm = reduce_scatters_[key];
      if (algorithm == nullptr) {
        std::vector<int> counts(size(), static_cast<int>(num_elements / size()));
        if (dtype == DType::kFp32) {
          algorithm = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
              context_, std::vector<float*>{static_cast<float*>(data)},
              static_cast<int>(num_elements), counts);
        } else {
          algorithm = std::make_unique<gloo::ReduceScatterHalvingDoubling<uint16_t>>(
              context_, std::vector<uint16_t*>{static_cast<uint16_t*>(data)},
              static_cast<int>(num_elements), counts, ReductionFor(dtype));
        }
      }
      algorithm->run();
    });
  }

  absl::Status AllGather(DType dtype, void* data, size_t num_elements) override {
    if (size() == 1) return absl::OkStatus();
    return Guarded("all-gather", [&] {
      size_t slice_bytes = num_elements / size() * DTypeSize(dtype);
      auto* bytes = static_cast<uint8_t*>(data);
      input_.assign(bytes + rank() * slice_bytes, bytes + (rank() + 1) * slice_bytes);
      gloo::AllgatherOptions opts(context_);
      opts.setInput(input_.data(), slice_bytes);
      opts.setOutput(bytes, slice_bytes * size());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  absl::Status AllReduceSum(absl::Span<double> values) override {
    if (size() == 1 || values.empty()) return absl::OkStatus();
    return Guarded("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(values.data(), values.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  absl::Status Barrier() override {
    if (size() == 1) return absl::OkStatus();
    return Guarded("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  std::map<std::tuple<void*, size_t, DType>, std::unique_ptr<gloo::Algorithm>> reduce_scatters_;
  std::vector<uint8_t> input_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options) {
  auto timeout = absl::ToChronoMilliseconds(options.timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  absl::Status s = Guarded("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(timeout);
    CoordinatorStore store(options.coordinator_address, options.key_prefix, options.abandon);
    context->connectFullMesh(store, device);
  });
  if (!s.ok()) return s;
  return std::unique_ptr<Collective>(new GlooCollective(std::move(context), timeout));
}

}  // namespace strata
