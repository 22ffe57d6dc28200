// Fuzzes the safetensors reader (core/safetensors.h: what `stratactl import`
// and CreateJob's initial weights read) with arbitrary files: it must return
// a status, never crash, overflow or allocate what the file merely claims.
#include <cstddef>
#include <cstdint>

#include "core/safetensors.h"
#include "tests/fuzz/fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = strata::fuzz::ScratchDir() + "/model.safetensors";
  strata::fuzz::WriteFile(path, data, size);
  absl::StatusOr<strata::SafetensorsFile> file = strata::ReadSafetensors(path);
  if (file.ok()) {
    // What was read is what the file holds: no tensor larger than the file.
    size_t values = 0;
    for (const auto& [name, tensor] : file->tensors) values += tensor.values.size();
    if (values * sizeof(float) > size) __builtin_trap();
  }
  return 0;
}
