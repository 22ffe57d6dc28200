// Fuzzes the checkpoint manifest reader (coordinator/checkpoint_store.h:
// ReadCheckpoint, what CreateJob's restore_from and ListCheckpoints read)
// with arbitrary manifest.json contents beside one small state file: it
// must return a status, never crash or overflow while checking that the
// files tile the flat space.
#include <cstddef>
#include <cstdint>
#include <string>

#include "coordinator/checkpoint_store.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const strata::PathRoot root = *strata::PathRoot::Open(
      std::filesystem::canonical(strata::fuzz::ScratchDir()).string(), "checkpoint_root");
  static const std::string dir = [] {
    std::string d = root.dir() + "/step-0000000001";
    std::filesystem::create_directories(d);
    const uint8_t state[12 * 64] = {};
    strata::fuzz::WriteFile(d + "/chunk-00000000.state", state, sizeof(state));
    return d;
  }();
  strata::fuzz::WriteFile(dir + "/manifest.json", data, size);
  (void)strata::ReadCheckpoint(root, dir);
  return 0;
}
