// Fuzzes the NVMe tier's extent checksums (storage/nvme_tier.h): an extent
// is written, freed, and adopted again -- as a restarted server does from its
// records -- at an offset, size and with checksums the input shifts or
// replaces; a read of what was adopted must then fail with DATA_LOSS or
// return exactly the bytes written, and nothing may crash or read outside
// the tier. Input: 1 byte of blocks written (1-8), 8 bytes added to the
// offset, 8 added to the size, 1 byte choosing the checksums (the true
// ones, none, the input's, or one too few), then checksums (8 bytes each).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "storage/nvme_tier.h"
#include "tests/fuzz/fuzz_files.h"

namespace {

constexpr uint64_t kBlock = strata::NvmeTier::kBlockBytes;
constexpr uint64_t kMaxBlocks = 8;

uint64_t Word(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

absl::Status Wait(const std::function<void(strata::IoDone)>& io) {
  absl::Notification done;
  absl::Status status;
  io([&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::NvmeTier* tier = [] {
    strata::NvmeTierOptions options;
    options.dir = strata::fuzz::ScratchDir();
    options.budget_bytes = 64 * kBlock;
    auto opened = strata::NvmeTier::Open(options);
    if (!opened.ok()) std::abort();  // io_uring and O_DIRECT are needed
    return opened->release();
  }();
  static std::byte* buffer =
      static_cast<std::byte*>(std::aligned_alloc(kBlock, kMaxBlocks * kBlock));
  if (size < 18) return 0;
  const uint64_t blocks = data[0] % kMaxBlocks + 1;
  const uint64_t num_bytes = blocks * kBlock;
  for (uint64_t i = 0; i < num_bytes; ++i) buffer[i] = std::byte(data[i % size] ^ (i >> 12));

  absl::StatusOr<strata::Extent> written = tier->Allocate(num_bytes);
  if (!written.ok()) __builtin_trap();
  if (!Wait([&](strata::IoDone done) {
         tier->Write(*written, 0, {buffer, num_bytes}, std::move(done));
       }).ok()) {
    __builtin_trap();
  }
  absl::StatusOr<std::vector<uint64_t>> truth = tier->Checksums(*written);
  if (!truth.ok()) __builtin_trap();
  tier->Free(*written);

  const uint64_t offset = written->offset + Word(data + 1);
  const uint64_t adopt_bytes = num_bytes + Word(data + 9);
  std::vector<uint64_t> checksums;
  switch (data[17] % 4) {
    case 0:
      checksums = *truth;
      break;
    case 1:
      break;
    case 2:
      for (size_t i = 18; i + 8 <= size; i += 8) checksums.push_back(Word(data + i));
      break;
    case 3:
      checksums.assign(truth->begin(), truth->end() - 1);
      break;
  }
  absl::StatusOr<strata::Extent> adopted = tier->Adopt(offset, adopt_bytes, checksums);
  if (!adopted.ok()) return 0;
  const uint64_t readable = std::min<uint64_t>(adopted->num_bytes, kMaxBlocks * kBlock);
  std::vector<std::byte> before(buffer, buffer + num_bytes);
  absl::Status read = Wait([&](strata::IoDone done) {
    tier->Read(*adopted, 0, {buffer, readable}, std::move(done));
  });
  // What reads back OK is what was written there, block for block.
  if (read.ok() && checksums == *truth && offset == written->offset &&
      std::memcmp(buffer, before.data(), std::min(readable, num_bytes)) != 0) {
    __builtin_trap();
  }
  tier->Free(*adopted);
  return 0;
}
