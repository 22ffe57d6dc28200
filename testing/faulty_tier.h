// FaultyTier: a TierWrapper that injects the faults a test asks for: failed
// writes and reads, short reads, and a full device. Thread-safe.
#ifndef STRATA_TESTING_FAULTY_TIER_H_
#define STRATA_TESTING_FAULTY_TIER_H_

#include <atomic>

#include "storage/tier_wrapper.h"

namespace strata::testing {

class FaultyTier : public TierWrapper {
 public:
  using TierWrapper::TierWrapper;

  // The next `n` writes (reads) fail with UNAVAILABLE and change nothing.
  void FailNextWrites(int n) { failing_writes_ = n; }
  void FailNextReads(int n) { failing_reads_ = n; }
  // The next `n` reads return only half their bytes and DATA_LOSS.
  void ShortenNextReads(int n) { short_reads_ = n; }
  // Allocate fails as if the device were full.
  void SetFull(bool full) { full_ = full; }

  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override {
    if (full_) return absl::ResourceExhaustedError("injected: the device is full");
    return TierWrapper::Allocate(num_bytes);
  }
  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override {
    if (Take(failing_writes_)) {
      std::move(done)(absl::UnavailableError("injected write failure"));
      return;
    }
    TierWrapper::Write(to, offset, from, std::move(done));
  }
  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override {
    if (Take(failing_reads_)) {
      std::move(done)(absl::UnavailableError("injected read failure"));
      return;
    }
    if (Take(short_reads_)) {
      TierWrapper::Read(from, offset, to.subspan(0, to.size() / 2),
                        [done = std::move(done)](absl::Status s) mutable {
                          std::move(done)(s.ok() ? absl::DataLossError("injected short read") : s);
                        });
      return;
    }
    TierWrapper::Read(from, offset, to, std::move(done));
  }

 private:
  static bool Take(std::atomic<int>& counter) {
    int n = counter.load();
    while (n > 0 && !counter.compare_exchange_weak(n, n - 1)) {
    }
    return n > 0;
  }

  std::atomic<int> failing_writes_{0};
  std::atomic<int> failing_reads_{0};
  std::atomic<int> short_reads_{0};
  std::atomic<bool> full_{false};
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_FAULTY_TIER_H_
