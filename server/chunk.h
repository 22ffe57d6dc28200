// Chunk: the state of one chunk of a job on a shard server (FP32 p, m, v and
// the low-precision copy of p) and its step state machine.
//
// A chunk at applied step t accepts pushes for step t+1. Pushed gradients
// are not copied: the chunk keeps a view of each push's bytes, and the push
// stays open until its step is applied. Once the pushed ranges cover the
// whole chunk it is ready: the step executor calls Apply(), which updates it
// exactly once, straight from the pushed bytes, then completes the pushes and
// answers every pull waiting for t+1. A push or pull for step t again returns
// the stored result; other steps are ABORTED.
//
// Thread-safety: all methods are thread-safe. Apply() runs on one executor
// thread at a time per chunk (Stage() returns true to exactly one caller per
// step), and only it touches p, m, v and the copy without the lock.
#ifndef STRATA_SERVER_CHUNK_H_
#define STRATA_SERVER_CHUNK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "storage/tier.h"
#include "strata/flat_layout.h"
#include "strata/types.h"

namespace strata {

class Chunk {
 public:
  // Receives the low-precision parameters of the pulled range, or an error.
  using PullDone = absl::AnyInvocable<void(absl::Status, int64_t step, absl::string_view bytes) &&>;
  // Receives the outcome of a staged push: OK once its step is applied, or
  // the error that ended it (shutdown, job dropped).
  using PushDone = absl::AnyInvocable<void(absl::Status) &&>;

  // Bytes of tier memory a chunk of `num_params` needs: p, m, v and the copy.
  static uint64_t NumBytes(uint64_t num_params, DType dtype);

  // `extent` holds NumBytes() zeroed bytes of `tier`; the chunk frees it.
  Chunk(std::string job_id, uint32_t chunk_id, FlatRange range, DType dtype, AdamConfig adam,
        Tier* tier, Extent extent);
  ~Chunk();
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  const std::string& job_id() const { return job_id_; }
  uint32_t chunk_id() const { return chunk_id_; }
  FlatRange range() const { return range_; }
  Tier* tier() const { return tier_; }
  uint64_t num_bytes() const { return extent_.num_bytes; }
  int64_t applied_step() const;

  // Stages the gradients of flat range [begin, begin + n) for `step`, without
  // copying: `grads` must stay valid until `done` is called. Returns true when
  // this push completed the chunk's range (the caller then has the chunk
  // applied), false otherwise. On OK the chunk calls `done` exactly once: at
  // once for a retry (the step is applied, or the range is already staged),
  // else when the step is applied or fails. ABORTED for old or future steps;
  // INVALID_ARGUMENT for a range that overlaps another push of the step or a
  // coef that differs from theirs; on error `done` is not called.
  absl::StatusOr<bool> Stage(int64_t step, uint64_t begin, uint64_t n, absl::string_view grads,
                             float coef, PushDone done);
  // Applies the staged step. Called once per step, after Stage() returned true.
  void Apply();
  // Answers with the copy of [begin, begin + n) at `step`, now or once applied.
  void Pull(int64_t step, uint64_t begin, uint64_t n, PullDone done);
  // Sets FP32 master weights of [begin, begin + n) before the first step;
  // FAILED_PRECONDITION once a step was pushed or applied.
  absl::Status WriteParams(uint64_t begin, const float* params, uint64_t n);
  // Copies p, m, v of [begin, begin + n) out (waiting out an Apply() in
  // progress); returns the applied step they hold.
  int64_t ReadState(uint64_t begin, uint64_t n, float* p, float* m, float* v) const;
  // Ends every waiting pull and every staged push with `status` (shutdown,
  // job dropped); the staged step can then be pushed again.
  void FailWaiters(const absl::Status& status);

 private:
  struct StagedPush {
    uint64_t end;
    absl::string_view grads;
    PushDone done;
  };
  struct Waiter {
    int64_t step;
    uint64_t begin;
    uint64_t n;
    PullDone done;
  };
  float* p() const;
  float* m() const;
  float* v() const;
  std::byte* copy() const;
  absl::string_view CopyBytes(uint64_t begin, uint64_t n) const;
  bool NotApplying() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !applying_; }

  const std::string job_id_;
  const uint32_t chunk_id_;
  const FlatRange range_;
  const DType dtype_;
  const AdamConfig adam_;
  Tier* const tier_;
  const Extent extent_;
  std::byte* const base_;

  mutable absl::Mutex mu_;
  int64_t applied_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  // Pushes staged for step applied_step_ + 1, by begin.
  std::map<uint64_t, StagedPush> staged_ ABSL_GUARDED_BY(mu_);
  uint64_t staged_params_ ABSL_GUARDED_BY(mu_) = 0;
  float staged_coef_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_SERVER_CHUNK_H_
