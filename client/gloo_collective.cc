// The Gloo implementation of Collective (CPU, TCP pairs). See collective.h.
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/collective.h"
#include "client/coordinator_store.h"
#include "core/status_macros.h"
#include "kernels/elementwise.h"

namespace strata {
namespace {

// Thrown inside an operation that Abort() ended.
struct AbortedOperation {};

// Runs `fn`, turning Gloo's exceptions into UNAVAILABLE and an abort into
// ABORTED.
template <typename Fn>
absl::Status Guarded(const char* what, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const AbortedOperation&) {
    return absl::AbortedError(absl::StrCat("gloo ", what, " aborted: the group was abandoned"));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo ", what, " failed: ", e.what()));
  }
}

// Every operation is a ring over Gloo's unbound buffers (whose waits Abort()
// can end): in step k (of size() - 1) rank r sends to rank r + 1 and
// receives from rank r - 1.
class GlooCollective : public Collective {
 public:
  GlooCollective(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status ReduceScatterSum(DType dtype, void* data, size_t num_elements) override {
    std::vector<size_t> counts(size(), num_elements / size());
    return ReduceScatterSumV(dtype, data, counts);
  }

  // Segment r ends on rank r with every rank's part added, in the order
  // r + 1, r + 2, ..., r: in step k rank r sends segment r - k - 1 and adds
  // segment r - k - 2 from rank r - 1 into its own; empty segments are
  // skipped on both ends. (Gloo's halving-doubling reduce-scatter puts the
  // segments in the wrong places when size() is not a power of two.)
  absl::Status ReduceScatterSumV(DType dtype, void* data,
                                 absl::Span<const size_t> counts) override {
    const int world = size();
    const size_t esize = DTypeSize(dtype);
    std::vector<size_t> offsets = {0};
    size_t largest = 0;
    for (size_t count : counts) {
      offsets.push_back(offsets.back() + count * esize);
      largest = std::max(largest, count * esize);
    }
    if (world == 1 || largest == 0) return absl::OkStatus();
    return Guarded("reduce-scatter", [&] {
      auto* bytes = static_cast<uint8_t*>(data);
      scratch_.resize(largest);
      Buffer buffer(this, bytes, offsets[world]);
      Buffer incoming(this, scratch_.data(), largest);
      const uint64_t slot = context_->nextSlot(world);
      for (int k = 0; k < world - 1; ++k) {
        const int send_segment = (rank() - k - 1 + 2 * world) % world;
        const int add_segment = (rank() - k - 2 + 2 * world) % world;
        const size_t send_bytes = offsets[send_segment + 1] - offsets[send_segment];
        const size_t add_bytes = offsets[add_segment + 1] - offsets[add_segment];
        if (add_bytes > 0) incoming->recv(Prev(), slot + k, 0, add_bytes);
        if (send_bytes > 0) buffer->send(Next(), slot + k, offsets[send_segment], send_bytes);
        if (add_bytes > 0) {
          WaitRecv(incoming);
          AddInPlace(dtype, scratch_.data(), bytes + offsets[add_segment], counts[add_segment]);
        }
        if (send_bytes > 0) WaitSend(buffer);
      }
    });
  }

  absl::Status AllGather(DType dtype, void* data, size_t num_elements) override {
    if (size() == 1) return absl::OkStatus();
    const size_t slice_bytes = num_elements / size() * DTypeSize(dtype);
    std::vector<size_t> offsets;
    for (int r = 0; r <= size(); ++r) offsets.push_back(r * slice_bytes);
    return Guarded("all-gather", [&] { RingGather(static_cast<uint8_t*>(data), offsets); });
  }

  absl::Status AllGatherV(DType dtype, const void* input, void* output,
                          absl::Span<const size_t> counts) override {
    const size_t esize = DTypeSize(dtype);
    std::vector<size_t> offsets = {0};
    for (size_t count : counts) offsets.push_back(offsets.back() + count * esize);
    auto* out = static_cast<uint8_t*>(output);
    if (counts[rank()] > 0) std::memcpy(out + offsets[rank()], input, counts[rank()] * esize);
    if (size() == 1) return absl::OkStatus();
    return Guarded("all-gather-v", [&] { RingGather(out, offsets); });
  }

  // Every rank gathers every rank's values and adds them in rank order:
  // the same bits on every rank.
  absl::Status AllReduceSum(absl::Span<double> values) override {
    if (size() == 1 || values.empty()) return absl::OkStatus();
    const size_t n = values.size();
    std::vector<double> all(n * size());
    std::copy(values.begin(), values.end(), all.begin() + rank() * n);
    std::vector<size_t> offsets;
    for (int r = 0; r <= size(); ++r) offsets.push_back(r * n * sizeof(double));
    return Guarded("all-reduce", [&] {
      RingGather(reinterpret_cast<uint8_t*>(all.data()), offsets);
      for (size_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int r = 0; r < size(); ++r) sum += all[r * n + i];
        values[i] = sum;
      }
    });
  }

  absl::Status Barrier() override {
    double nothing = 0;
    return AllReduceSum(absl::MakeSpan(&nothing, 1));
  }

  void Abort() override {
    absl::MutexLock lock(&abort_mu_);
    aborted_ = true;
    for (gloo::transport::UnboundBuffer* buffer : active_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }

 private:
  // An unbound buffer over `size` bytes at `data`, whose waits Abort() ends
  // while it lives. Throws AbortedOperation once aborted.
  class Buffer {
   public:
    Buffer(GlooCollective* owner, void* data, size_t size)
        : owner_(owner), buffer_(owner->context_->createUnboundBuffer(data, size)) {
      absl::MutexLock lock(&owner_->abort_mu_);
      if (owner_->aborted_) throw AbortedOperation();
      owner_->active_.insert(buffer_.get());
    }
    ~Buffer() {
      absl::MutexLock lock(&owner_->abort_mu_);
      owner_->active_.erase(buffer_.get());
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    gloo::transport::UnboundBuffer* operator->() const { return buffer_.get(); }
    gloo::transport::UnboundBuffer& operator*() const { return *buffer_; }

   private:
    GlooCollective* const owner_;
    const std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  };

  int Next() const { return (rank() + 1) % size(); }
  int Prev() const { return (rank() + size() - 1) % size(); }
  // Gloo's waits return false when aborted and throw on a timeout or a
  // broken pair.
  void WaitRecv(const Buffer& buffer) {
    if (!buffer->waitRecv(timeout_)) throw AbortedOperation();
  }
  void WaitSend(const Buffer& buffer) {
    if (!buffer->waitSend(timeout_)) throw AbortedOperation();
  }

  // Rank r's part is [offsets[r], offsets[r + 1]) of `data`, in place on
  // rank r; afterwards every rank holds every part. In step k rank r
  // passes on part r - k and receives part r - k - 1.
  void RingGather(uint8_t* data, const std::vector<size_t>& offsets) {
    const int world = size();
    Buffer buffer(this, data, offsets[world]);
    const uint64_t slot = context_->nextSlot(world);
    for (int k = 0; k < world - 1; ++k) {
      const int send_part = (rank() - k + world) % world;
      const int recv_part = (rank() - k - 1 + world) % world;
      const size_t send_bytes = offsets[send_part + 1] - offsets[send_part];
      const size_t recv_bytes = offsets[recv_part + 1] - offsets[recv_part];
      // Empty parts are skipped on both ends (every rank knows the sizes).
      if (recv_bytes > 0) buffer->recv(Prev(), slot + k, offsets[recv_part], recv_bytes);
      if (send_bytes > 0) buffer->send(Next(), slot + k, offsets[send_part], send_bytes);
      if (recv_bytes > 0) WaitRecv(buffer);
      if (send_bytes > 0) WaitSend(buffer);
    }
  }

  std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  std::vector<uint8_t> scratch_;  // a segment received by the reduce-scatter
  absl::Mutex abort_mu_;
  bool aborted_ ABSL_GUARDED_BY(abort_mu_) = false;
  absl::flat_hash_set<gloo::transport::UnboundBuffer*> active_ ABSL_GUARDED_BY(abort_mu_);
};

// A fifth of the longest a pair of a forming group may take to connect.
constexpr std::chrono::milliseconds kConnectTimeout(2000);

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
  std::shared_ptr<gloo::transport::Device> device;
  absl::Status s = Guarded("device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!s.ok()) {
    // An address this host cannot listen on: no retry makes it one.
    return absl::InvalidArgumentError(
        absl::StrCat("collective_hostname '", options.hostname, "': ", s.message()));
  }
  std::shared_ptr<gloo::rendezvous::Context> context;
  s = Guarded("rendezvous", [&] {
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    // Gloo waits up to 5x its context's timeout for a pair to connect, and
    // cannot be abandoned meanwhile. A peer whose key was read listened
    // already, so a refused connection means it left the generation: the
    // wait for it is kept short; the wait for its key is the whole timeout.
    context->setTimeout(std::min(timeout, kConnectTimeout));
    CoordinatorStore store(options.coordinator_address, options.coordinator_credentials,
                           options.key_prefix, options.abandon, options.timeout);
    context->connectFullMesh(store, device);
    context->setTimeout(timeout);
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
