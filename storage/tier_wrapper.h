// TierWrapper: a Tier that forwards every call to another tier (leveldb's
// EnvWrapper pattern). Subclasses override only what they change; tests use
// it to inject faults. Thread-safe exactly as the wrapped tier is; the
// wrapped tier must outlive the wrapper.
#ifndef STRATA_STORAGE_TIER_WRAPPER_H_
#define STRATA_STORAGE_TIER_WRAPPER_H_

#include <utility>

#include "storage/tier.h"

namespace strata {

class TierWrapper : public Tier {
 public:
  explicit TierWrapper(Tier* target) : target_(target) {}

  TierKind kind() const override { return target_->kind(); }
  uint64_t budget_bytes() const override { return target_->budget_bytes(); }
  uint64_t used_bytes() const override { return target_->used_bytes(); }
  uint64_t kept_bytes() const override { return target_->kept_bytes(); }
  absl::StatusOr<Extent> Allocate(uint64_t num_bytes) override {
    return target_->Allocate(num_bytes);
  }
  absl::StatusOr<Extent> AllocateToFill(uint64_t num_bytes) override {
    return target_->AllocateToFill(num_bytes);
  }
  absl::Status Settle(const Extent& extent) override { return target_->Settle(extent); }
  void Free(const Extent& extent) override { target_->Free(extent); }
  void Read(const Extent& from, uint64_t offset, absl::Span<std::byte> to, IoDone done) override {
    target_->Read(from, offset, to, std::move(done));
  }
  void Write(const Extent& to, uint64_t offset, absl::Span<const std::byte> from,
             IoDone done) override {
    target_->Write(to, offset, from, std::move(done));
  }
  std::byte* Map(const Extent& extent) override { return target_->Map(extent); }
  std::byte* DeviceAddress(const Extent& extent) override { return target_->DeviceAddress(extent); }
  absl::StatusOr<std::vector<uint64_t>> Checksums(const Extent& extent) const override {
    return target_->Checksums(extent);
  }

 protected:
  Tier* target() const { return target_; }

 private:
  Tier* const target_;
};

}  // namespace strata

#endif  // STRATA_STORAGE_TIER_WRAPPER_H_
