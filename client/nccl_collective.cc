// The NCCL implementation of Collective (GPU). Buffers in device memory are
// reduced and gathered in place; host buffers are staged through one device
// buffer of the collective's (copied in, operated on, copied out). Built
// only where the CUDA toolkit is found; see collective.h.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/collective.h"
#include "client/coordinator_store.h"
#include "core/status_macros.h"
#include "kernels/cuda/cuda_memory.h"
#include "kernels/cuda/cuda_status.h"

namespace strata {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFp16:
      return ncclFloat16;
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kFp32:
      return ncclFloat32;
  }
  return ncclFloat32;
}

class NcclCollective : public Collective {
 public:
  NcclCollective(int rank, int size, int device, ncclComm_t comm, cudaStream_t stream)
      : rank_(rank), size_(size), device_ordinal_(device), comm_(comm), stream_(stream) {}
  ~NcclCollective() override {
    if (device_ != nullptr) cudaFree(device_);
    absl::MutexLock lock(&comm_mu_);
    if (!aborted_) ncclCommDestroy(comm_);  // ncclCommAbort freed it
    cudaStreamDestroy(stream_);
  }

  void Abort() override {
    absl::MutexLock lock(&comm_mu_);
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);  // ends the kernels the stream waits for
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status ReduceScatterSum(DType dtype, void* data, size_t num_elements) override {
    return Run([&]() -> absl::Status {
      const size_t esize = DTypeSize(dtype);
      const size_t slice_bytes = num_elements / size_ * esize;
      ASSIGN_OR_RETURN(char* work, Workspace(data, num_elements * esize, /*copy_in=*/true));
      RETURN_IF_ERROR(
          NcclStatus(ncclReduceScatter(work, work + rank_ * slice_bytes, num_elements / size_,
                                       NcclType(dtype), ncclSum, comm_, stream_),
                     "reduce-scatter"));
      return CopyOut(work, data, rank_ * slice_bytes, slice_bytes);
    });
  }

  // One reduce to each segment's rank, in one NCCL group.
  absl::Status ReduceScatterSumV(DType dtype, void* data,
                                 absl::Span<const size_t> counts) override {
    return Run([&]() -> absl::Status {
      const size_t esize = DTypeSize(dtype);
      const auto [total, mine] = SegmentBytes(counts, esize);
      if (total == 0) return absl::OkStatus();
      ASSIGN_OR_RETURN(char* dev, Workspace(data, total, /*copy_in=*/true));
      RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "group start"));
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        if (counts[r] > 0) {
          ncclResult_t result = ncclReduce(dev + offset, dev + offset, counts[r], NcclType(dtype),
                                           ncclSum, r, comm_, stream_);
          if (result != ncclSuccess) {
            ncclGroupEnd();
            return NcclStatus(result, "reduce");
          }
        }
        offset += counts[r] * esize;
      }
      RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "group end"));
      return CopyOut(dev, data, mine, counts[rank_] * esize);
    });
  }

  absl::Status AllGather(DType dtype, void* data, size_t num_elements) override {
    return Run([&]() -> absl::Status {
      const size_t slice_bytes = num_elements / size_ * DTypeSize(dtype);
      ASSIGN_OR_RETURN(char* work, Workspace(data, slice_bytes * size_, /*copy_in=*/false));
      char* mine = work + rank_ * slice_bytes;
      if (work != data) {
        RETURN_IF_ERROR(Stage(mine, static_cast<char*>(data) + rank_ * slice_bytes, slice_bytes));
      }
      RETURN_IF_ERROR(NcclStatus(ncclAllGather(mine, work, slice_bytes, ncclUint8, comm_, stream_),
                                 "all-gather"));
      return CopyOut(work, data, 0, slice_bytes * size_);
    });
  }

  // One broadcast per rank, in one NCCL group.
  absl::Status AllGatherV(DType dtype, const void* input, void* output,
                          absl::Span<const size_t> counts) override {
    return Run([&]() -> absl::Status {
      const size_t esize = DTypeSize(dtype);
      const auto [total, mine] = SegmentBytes(counts, esize);
      ASSIGN_OR_RETURN(char* dev, Workspace(output, total, /*copy_in=*/false));
      RETURN_IF_ERROR(Stage(dev + mine, input, counts[rank_] * esize));
      RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "group start"));
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        size_t bytes = counts[r] * esize;
        if (bytes > 0) {
          ncclResult_t result =
              ncclBroadcast(dev + offset, dev + offset, bytes, ncclUint8, r, comm_, stream_);
          if (result != ncclSuccess) {
            ncclGroupEnd();
            return NcclStatus(result, "broadcast");
          }
        }
        offset += bytes;
      }
      RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "group end"));
      return CopyOut(dev, output, 0, total);
    });
  }

  absl::Status AllReduceSum(absl::Span<double> values) override {
    return Run([&]() -> absl::Status {
      const size_t bytes = values.size() * sizeof(double);
      ASSIGN_OR_RETURN(char* dev, Workspace(values.data(), bytes, /*copy_in=*/true));
      RETURN_IF_ERROR(
          NcclStatus(ncclAllReduce(dev, dev, values.size(), ncclFloat64, ncclSum, comm_, stream_),
                     "all-reduce"));
      return CopyOut(dev, values.data(), 0, bytes);
    });
  }

  absl::Status Barrier() override {
    double one = 1;
    return AllReduceSum(absl::MakeSpan(&one, 1));
  }

 private:
  // The bytes of segments of counts[r] elements of `esize` bytes in all, and
  // where rank_'s starts.
  std::pair<size_t, size_t> SegmentBytes(absl::Span<const size_t> counts, size_t esize) const {
    size_t total = 0, mine = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) mine = total;
      total += counts[r] * esize;
    }
    return {total, mine};
  }

  // Has `enqueue` queue an operation on stream_ unless the communicator was
  // aborted (Abort() waits for it), then waits for the stream outside the
  // lock, so that an abort can end the wait.
  absl::Status Run(absl::FunctionRef<absl::Status()> enqueue) {
    {
      absl::ReaderMutexLock lock(&comm_mu_);
      if (aborted_) return absl::AbortedError("NCCL group aborted: the group was abandoned");
      // The current device is per thread; the group's may not be this thread's.
      RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_ordinal_), "set device"));
      RETURN_IF_ERROR(enqueue());
    }
    return CudaStatus(cudaStreamSynchronize(stream_), "synchronize");
  }

  // Where an operation over `size_bytes` at `data` runs: `data` itself when
  // it is device memory (in place), else the staging buffer, filled from
  // `data` when `copy_in`.
  absl::StatusOr<char*> Workspace(void* data, size_t size_bytes, bool copy_in) {
    if (CudaDeviceOf(data) >= 0) return static_cast<char*>(data);
    ASSIGN_OR_RETURN(char* staging, DeviceBuffer(size_bytes));
    if (copy_in) RETURN_IF_ERROR(Stage(staging, data, size_bytes));
    return staging;
  }
  // Queues a copy of `size_bytes` from `from` to `to` (host or device memory).
  absl::Status Stage(void* to, const void* from, size_t size_bytes) {
    if (size_bytes == 0) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(to, from, size_bytes, cudaMemcpyDefault, stream_), "copy");
  }
  // After an operation in `work`: the result's `size_bytes` at `offset` back
  // to `data` when `work` is the staging buffer.
  absl::Status CopyOut(char* work, void* data, size_t offset, size_t size_bytes) {
    if (work == data) return absl::OkStatus();
    return Stage(static_cast<char*>(data) + offset, work + offset, size_bytes);
  }

  absl::StatusOr<char*> DeviceBuffer(size_t num_bytes) {
    if (num_bytes > device_bytes_) {
      if (device_ != nullptr) cudaFree(device_);
      device_ = nullptr;
      device_bytes_ = 0;
      RETURN_IF_ERROR(CudaStatus(cudaMalloc(&device_, num_bytes), "malloc"));
      device_bytes_ = num_bytes;
    }
    return static_cast<char*>(device_);
  }

  absl::Mutex comm_mu_;
  bool aborted_ ABSL_GUARDED_BY(comm_mu_) = false;
  const int rank_;
  const int size_;
  const int device_ordinal_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  void* device_ = nullptr;
  size_t device_bytes_ = 0;
};

}  // namespace

int NcclDeviceCount() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

absl::StatusOr<std::unique_ptr<Collective>> CreateNcclCollective(const CollectiveOptions& options) {
  const int devices = NcclDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError("NCCL collective: no CUDA device is present");
  }
  const int device = options.cuda_device >= 0 ? options.cuda_device : options.rank % devices;
  if (device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL collective: CUDA device ", device,
                                                      " asked for; this machine has ", devices));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "set device"));
  CoordinatorStore store(options.coordinator_address, options.coordinator_credentials,
                         options.key_prefix, options.abandon);
  ncclUniqueId id;
  if (options.rank == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "unique id"));
    RETURN_IF_ERROR(store.Set("nccl_unique_id", std::string(id.internal, sizeof(id.internal))));
  } else {
    RETURN_IF_ERROR(store.Wait({"nccl_unique_id"}, absl::ToChronoMilliseconds(options.timeout)));
    ASSIGN_OR_RETURN(std::string bytes, store.Get("nccl_unique_id"));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError("NCCL unique id in the rendezvous store has the wrong size");
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  // Non-blocking: the trainer's work on the legacy default stream neither
  // waits for the group's operations nor holds them up (every operation is
  // waited for by its caller, so nothing relies on that ordering).
  cudaStream_t stream;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  ncclComm_t comm;
  absl::Status s = NcclStatus(ncclCommInitRank(&comm, options.size, id, options.rank), "init rank");
  if (!s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Collective>(
      new NcclCollective(options.rank, options.size, device, comm, stream));
}

}  // namespace strata
