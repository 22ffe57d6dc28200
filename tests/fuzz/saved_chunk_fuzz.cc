// Fuzzes the saved-chunk loaders (shard/saved_chunk.h: LoadChunkState and
// LoadBytes, what LoadChunks and a restarted server read) with arbitrary
// files, sizes and checksums. Input: 1 byte of flags, 2 bytes of
// num_params (little-endian), then the file. Flag bit 0 keeps the file's
// true checksum (else it is off by one), so that both the checksum's and
// the size's checks are reached.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shard/saved_chunk.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const bool true_checksum = (data[0] & 1) != 0;
  const uint64_t num_params = data[1] | (uint64_t{data[2]} << 8);
  const std::string contents(reinterpret_cast<const char*>(data + 3), size - 3);
  static const std::string path = strata::fuzz::ScratchDir() + "/chunk.state";
  absl::StatusOr<uint64_t> checksum = strata::SaveBytes(path, contents);
  if (!checksum.ok()) __builtin_trap();
  const uint64_t expected = true_checksum ? *checksum : *checksum + 1;

  std::vector<float> state(3 * num_params);
  absl::Status loaded = strata::LoadChunkState(path, expected, 12 * num_params,
                                               reinterpret_cast<std::byte*>(state.data()));
  // A load succeeds only for the right size and checksum.
  if (loaded.ok() && (!true_checksum || contents.size() != state.size() * sizeof(float))) {
    __builtin_trap();
  }
  absl::StatusOr<std::string> bytes = strata::LoadBytes(path, expected, num_params);
  if (bytes.ok() && (!true_checksum || *bytes != contents)) __builtin_trap();
  return 0;
}
