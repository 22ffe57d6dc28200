// HostTier: chunk extents in host memory, 64-byte aligned, within a byte
// budget. Thread-safe. Reads and writes are memcpy and complete inline.
// (Page-locking the memory is the tiered-storage work; see docs/.)
#ifndef STRATA_STORAGE_HOST_TIER_H_
#define STRATA_STORAGE_HOST_TIER_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "storage/tier.h"

namespace strata {

class HostTier : public Tier {
 public:
  explicit HostTier(uint64_t budget_bytes);
  ~HostTier() override;

  TierKind kind() const override { return TierKind::kHost; }
  uint64_t budget_bytes() const override { return budget_bytes_; }
  uint64_t used_bytes() const override;
  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override;
  void Free(const Extent& extent) override;
  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override;
  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override;
  std::byte* Map(const Extent& extent) override;

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const;
  };
  // OUT_OF_RANGE unless [offset, offset + num_bytes) lies in `extent`.
  absl::StatusOr<std::byte*> Locate(const Extent& extent, uint64_t offset, uint64_t num_bytes);

  const uint64_t budget_bytes_;
  mutable absl::Mutex mu_;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<std::byte, FreeDeleter>> blocks_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_STORAGE_HOST_TIER_H_
