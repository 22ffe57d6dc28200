#include "client/gradient_memory.h"

#include <algorithm>

namespace strata {

void GradientMemory::Reset(const Buckets& buckets, FlatRange slice, size_t esize) {
  absl::MutexLock lock(&mu_);
  buckets_ = buckets;
  slice_range_ = slice;
  esize_ = esize;
  const uint64_t padded_bytes = buckets.padded_num_params() * esize;
  if (!sharded_ || !whole_.empty()) whole_.resize(padded_bytes, 0);
  if (sharded_) slice_.assign(slice.size() * esize, 0);
  own_.clear();
  own_.resize(buckets.size());
  held_bytes_ = 0;
  Account(static_cast<int64_t>(whole_.size() + slice_.size()));
}

uint8_t* GradientMemory::Whole() {
  if (whole_.empty()) {
    absl::MutexLock lock(&mu_);
    whole_.resize(buckets_.padded_num_params() * esize_, 0);
    Account(static_cast<int64_t>(whole_.size()));
  }
  return whole_.data();
}

uint8_t* GradientMemory::Bucket(size_t i) {
  if (!whole_.empty()) return whole_.data() + buckets_.bucket(i).begin * esize_;
  absl::MutexLock lock(&mu_);
  if (own_[i] == nullptr) {
    const uint64_t bytes = buckets_.bucket(i).size() * esize_;
    own_[i] = std::make_unique<uint8_t[]>(bytes);  // zeros
    Account(static_cast<int64_t>(bytes));
  }
  return own_[i].get();
}

void GradientMemory::ReleaseBucket(size_t i) {
  absl::MutexLock lock(&mu_);
  if (own_[i] == nullptr) return;
  own_[i].reset();
  Account(-static_cast<int64_t>(buckets_.bucket(i).size() * esize_));
}

void GradientMemory::Clear() {
  if (!sharded_) {
    std::fill(whole_.begin(), whole_.end(), 0);
    return;
  }
  absl::MutexLock lock(&mu_);
  std::fill(slice_.begin(), slice_.end(), 0);
  for (size_t i = 0; i < own_.size(); ++i) {
    if (own_[i] == nullptr) continue;
    own_[i].reset();
    Account(-static_cast<int64_t>(buckets_.bucket(i).size() * esize_));
  }
  if (!whole_.empty()) {
    Account(-static_cast<int64_t>(whole_.size()));
    std::vector<uint8_t>().swap(whole_);
  }
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
