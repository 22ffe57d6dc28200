#include "coordinator/generation_stream.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/grpc_status.h"

namespace strata {
namespace {

// Streams a job's generations to one watcher: the current one if newer than
// what the client knows, then each new one. One write in flight; a newer
// generation that arrives meanwhile replaces the pending one.
class GenerationStream : public grpc::ServerWriteReactor<v1::Generation>,
                         public Membership::Watcher {
 public:
  GenerationStream(Membership* membership, std::string job_id, uint64_t known,
                   std::string worker_id)
      : membership_(membership),
        job_id_(std::move(job_id)),
        worker_id_(std::move(worker_id)),
        opened_(absl::Now()),
        sent_(known) {
    if (!worker_id_.empty()) membership_->Watching(job_id_, worker_id_, opened_);
    OnGeneration(membership_->Subscribe(job_id_, this));
  }

  void OnGeneration(const v1::Generation& generation) override {
    absl::MutexLock lock(&mu_);
    if (generation.number() <= sent_ || closing_) return;
    pending_ = generation;
    has_pending_ = true;
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok || closing_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "generation stream closed"));
    } else if (has_pending_) {
      WriteNextLocked();
    }
  }

  void OnStop() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      FinishLocked(grpc::Status::OK);
    }
    // Not under mu_: the membership may tell this stream of a generation.
    if (!worker_id_.empty()) membership_->Disconnected(job_id_, worker_id_, opened_);
  }

  void OnDone() override {
    membership_->Unsubscribe(job_id_, this);
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    has_pending_ = false;
    current_ = pending_;
    sent_ = current_.number();
    StartWrite(&current_);
  }
  // Finishes now, or once the write in flight is done.
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    closing_ = true;
    if (writing_ || finished_) return;
    finished_ = true;
    Finish(status);
  }

  Membership* const membership_;
  const std::string job_id_;
  const std::string worker_id_;
  const absl::Time opened_;
  absl::Mutex mu_;
  uint64_t sent_ ABSL_GUARDED_BY(mu_);
  v1::Generation pending_ ABSL_GUARDED_BY(mu_), current_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A stream refused before it started.
class RefusedStream : public grpc::ServerWriteReactor<v1::Generation> {
 public:
  explicit RefusedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::Generation>* NewGenerationStream(Membership* membership,
                                                              std::string job_id, uint64_t known,
                                                              std::string worker_id) {
  return new GenerationStream(membership, std::move(job_id), known, std::move(worker_id));
}

grpc::ServerWriteReactor<v1::Generation>* RefusedGenerationStream(const absl::Status& status) {
  return new RefusedStream(status);
}

}  // namespace strata
