#include "client/gradient_memory.h"

#include <algorithm>

#include "core/status_macros.h"

namespace strata {

absl::Status GradientMemory::Reset(const Buckets& buckets, FlatRange slice, size_t esize) {
  absl::MutexLock lock(&mu_);
  buckets_ = buckets;
  slice_range_ = slice;
  esize_ = esize;
  const uint64_t padded_bytes = buckets.padded_num_params() * esize;
  if ((!sharded_ || !whole_.empty()) && whole_.size() != padded_bytes) {
    // The padding is at the end: every flat position keeps its offset.
    ASSIGN_OR_RETURN(DeviceMemory whole, device_->Allocate(padded_bytes));
    RETURN_IF_ERROR(
        device_->Copy(whole.data(), whole_.data(), std::min<size_t>(whole.size(), whole_.size())));
    whole_ = std::move(whole);
  }
  slice_.Reset();
  if (separate_slice()) {
    ASSIGN_OR_RETURN(slice_, device_->AllocateHost(slice.size() * esize));
  }
  own_.clear();
  own_.resize(buckets.size());
  held_bytes_ = 0;
  Account(static_cast<int64_t>(whole_.size() + slice_.size()));
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> GradientMemory::Whole() {
  if (whole_.empty()) {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(whole_, device_->Allocate(buckets_.padded_num_params() * esize_));
    Account(static_cast<int64_t>(whole_.size()));
  }
  return whole_.data();
}

absl::StatusOr<uint8_t*> GradientMemory::Bucket(size_t i) {
  if (!whole_.empty()) return whole_.data() + buckets_.bucket(i).begin * esize_;
  absl::MutexLock lock(&mu_);
  if (own_[i].empty()) {
    ASSIGN_OR_RETURN(own_[i], device_->Allocate(buckets_.bucket(i).size() * esize_));
    Account(static_cast<int64_t>(own_[i].size()));
  }
  return own_[i].data();
}

void GradientMemory::ReleaseBucket(size_t i) {
  absl::MutexLock lock(&mu_);
  if (own_[i].empty()) return;
  Account(-static_cast<int64_t>(own_[i].size()));
  own_[i].Reset();
}

absl::Status GradientMemory::KeepReduced(FlatRange part, const uint8_t* reduced) {
  uint8_t* to = Slice() + (part.begin - slice_range_.begin) * esize_;
  if (to == reduced) return absl::OkStatus();
  return device_->Copy(to, reduced, part.size() * esize_);
}

absl::Status GradientMemory::Clear() {
  if (!sharded_) {
    RETURN_IF_ERROR(device_->Zero(whole_.data(), whole_.size()));
    if (separate_slice()) std::fill(slice_.data(), slice_.data() + slice_.size(), 0);
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  std::fill(slice_.data(), slice_.data() + slice_.size(), 0);
  for (DeviceMemory& own : own_) {
    Account(-static_cast<int64_t>(own.size()));
    own.Reset();
  }
  Account(-static_cast<int64_t>(whole_.size()));
  whole_.Reset();
  return absl::OkStatus();
}

uint64_t GradientMemory::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_bytes_;
}

void GradientMemory::Account(int64_t delta_bytes) {
  held_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(held_bytes_) + delta_bytes);
  peak_bytes_ = std::max(peak_bytes_, held_bytes_);
}

}  // namespace strata
