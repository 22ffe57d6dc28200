// Collective: the group operations that workers of one job run among
// themselves, over a flat buffer of `num_elements` elements of a DType that
// the world cuts into size() equal slices (num_elements % size() == 0).
// Implementations: Gloo (CPU, TCP) and NCCL (GPU). Both rendezvous through
// the coordinator's key-value store. Failures and time-outs are returned as
// UNAVAILABLE, never an abort of the process. Not thread-safe (except
// Abort()): one thread per instance, and every rank must call the same
// operations in the same order.
#ifndef STRATA_CLIENT_COLLECTIVE_H_
#define STRATA_CLIENT_COLLECTIVE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "strata/types.h"

#include "rpc/tls.h"

namespace strata {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums `data` over all ranks; afterwards slice rank() holds the sum and the
  // other slices are unspecified.
  virtual absl::Status ReduceScatterSum(DType dtype, void* data, size_t num_elements) = 0;
  // The same over segments of any length: `data` is counts[0] + ... +
  // counts[size() - 1] elements, segment r counts[r] of them (counts is the
  // same on every rank; a segment may be empty). Each element of segment r
  // is added in the order ReduceScatterSum adds an element of slice r, so a
  // range reduced by either on the same rank has the same bits (Gloo).
  virtual absl::Status ReduceScatterSumV(DType dtype, void* data,
                                         absl::Span<const size_t> counts) = 0;
  // Slice rank() of `data` is this rank's input; afterwards every slice holds
  // the input of its rank.
  virtual absl::Status AllGather(DType dtype, void* data, size_t num_elements) = 0;
  // Rank r's input is counts[r] elements (counts is the same on every
  // rank); afterwards `output` holds every rank's input in rank order.
  // `input` and `output` do not overlap.
  virtual absl::Status AllGatherV(DType dtype, const void* input, void* output,
                                  absl::Span<const size_t> counts) = 0;
  virtual absl::Status AllReduceSum(absl::Span<double> values) = 0;
  virtual absl::Status Barrier() = 0;
  // Thread-safe, from any thread (a member of the group hangs and the
  // group is abandoned): the operation in progress and every later one end
  // with ABORTED. The instance is then good only for destruction.
  virtual void Abort() = 0;
};

struct CollectiveOptions {
  std::string coordinator_address;
  ChannelCredentials coordinator_credentials = PlaintextCredentials();
  std::string key_prefix;  // rendezvous keys of this group start with it
  int rank = 0;
  int size = 1;
  std::string hostname = "127.0.0.1";  // Gloo: address this rank listens on
  int cuda_device = -1;                // NCCL: the GPU; -1: rank % NcclDeviceCount()
  absl::Duration timeout = absl::Seconds(60);
  // Polled while waiting for peers at rendezvous: true gives up (ABORTED),
  // e.g. because a newer generation formed. Empty: never.
  std::function<bool()> abandon;
};

// Returns once every rank of the group has connected to every other, so a
// rank may drop its group at once without failing a slower rank's formation.
// UNAVAILABLE when the group cannot be formed within the timeout or is
// abandoned. From the first call on, the process ignores SIGPIPE unless it
// handles it itself: a peer that dies mid-write is then an error of the
// collective, not the end of this process.
absl::StatusOr<std::unique_ptr<Collective>> CreateGlooCollective(const CollectiveOptions& options);
// FAILED_PRECONDITION where strata was built without CUDA or no GPU is
// present. Rank r uses options.cuda_device, or else GPU r % NcclDeviceCount();
// NCCL refuses (UNAVAILABLE) two ranks of one group on one GPU. Buffers in
// that GPU's memory are operated on in place; host buffers are staged.
absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions& options);
// The GPUs this process can use for NCCL: 0 without CUDA or a device.
int NcclDeviceCount();

}  // namespace strata

#endif  // STRATA_CLIENT_COLLECTIVE_H_
