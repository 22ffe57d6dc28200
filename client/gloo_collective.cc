// The Gloo implementation of Collective (CPU, TCP pairs). See collective.h.
#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "client/collective.h"
#include "client/coordinator_store.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"

namespace strata {
namespace {

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

  // A ring: in step k (of size() - 1) rank r sends segment r - k - 1 to
  // rank r + 1 and adds segment r - k - 2 from rank r - 1 into its own, so
  // that segment r ends on rank r with every rank's part added, in the order
  // r + 1, r + 2, ..., r. (Gloo's halving-doubling reduce-scatter puts the
  // segments in the wrong places when size() is not a power of two.)
  absl::Status ReduceScatterSum(DType dtype, void* data, size_t num_elements) override {
    if (size() == 1) return absl::OkStatus();
    return Guarded("reduce-scatter", [&] {
      const int world = size();
      const size_t segment = num_elements / world;
      const size_t segment_bytes = segment * DTypeSize(dtype);
      auto* bytes = static_cast<uint8_t*>(data);
      scratch_.resize(segment_bytes);
      auto buffer = context_->createUnboundBuffer(bytes, num_elements * DTypeSize(dtype));
      auto incoming = context_->createUnboundBuffer(scratch_.data(), segment_bytes);
      const int next = (rank() + 1) % world;
      const int prev = (rank() + world - 1) % world;
      const uint64_t slot = context_->nextSlot(world);
      for (int k = 0; k < world - 1; ++k) {
        size_t send_segment = (rank() - k - 1 + 2 * world) % world;
        size_t add_segment = (rank() - k - 2 + 2 * world) % world;
        incoming->recv(prev, slot + k, 0, segment_bytes);
        buffer->send(next, slot + k, send_segment * segment_bytes, segment_bytes);
        incoming->waitRecv(timeout_);
        AddInPlace(dtype, scratch_.data(), bytes + add_segment * segment_bytes, segment);
        buffer->waitSend(timeout_);
      }
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

  absl::Status AllGatherV(DType dtype, const void* input, void* output,
                          absl::Span<const size_t> counts) override {
    const size_t esize = DTypeSize(dtype);
    if (size() == 1) {
      std::memcpy(output, input, counts[0] * esize);
      return absl::OkStatus();
    }
    return Guarded("all-gather-v", [&] {
      std::vector<size_t> bytes_per_rank;
      for (size_t count : counts) bytes_per_rank.push_back(count * esize);
      gloo::AllgathervOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes_per_rank[rank()]);
      opts.setOutput(static_cast<uint8_t*>(output), std::move(bytes_per_rank));
      opts.setTimeout(timeout_);
      gloo::allgatherv(opts);
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
  std::vector<uint8_t> scratch_;  // a segment received by the reduce-scatter
  std::vector<uint8_t> input_;
};

// Gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would
// kill this process with SIGPIPE (no message, no status) instead of failing
// the collective. Ignored unless the process installed a handler of its own.
void IgnoreSigpipe() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options) {
  IgnoreSigpipe();
  auto timeout = absl::ToChronoMilliseconds(options.timeout);
  std::shared_ptr<gloo::rendezvous::Context> context;
  absl::Status s = Guarded("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(timeout);
    CoordinatorStore store(options.coordinator_address, options.coordinator_credentials,
                           options.key_prefix, options.abandon);
    context->connectFullMesh(store, device);
  });
  if (!s.ok()) return s;
  auto collective = std::make_unique<GlooCollective>(std::move(context), timeout);
  // A rank's connectFullMesh returns when its own pairs are connected; a peer
  // may not have accepted them yet. Had this rank dropped the group then, the
  // peer would accept a closed socket and fail its formation ("Connection
  // closed by peer"). Past a barrier every rank has connected all its pairs.
  RETURN_IF_ERROR(collective->Barrier());
  return collective;
}

}  // namespace strata
