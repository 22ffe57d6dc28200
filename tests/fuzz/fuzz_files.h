// Helpers of the file-reading harnesses: a scratch directory of this
// process (removed at exit) and writing an input to a file in it. Not
// thread-safe (libFuzzer runs one input at a time).
#ifndef STRATA_TESTS_FUZZ_FUZZ_FILES_H_
#define STRATA_TESTS_FUZZ_FUZZ_FILES_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace strata::fuzz {

// A directory of this process's own, under $TMPDIR (default /tmp).
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/strata-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    auto* made = new std::string(pattern);
    std::atexit([] { std::filesystem::remove_all(*dir); });
    return made;
  }();
  return *dir;
}

// Writes `size` bytes of `data` to `path` (replacing it).
inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
}

}  // namespace strata::fuzz

#endif  // STRATA_TESTS_FUZZ_FUZZ_FILES_H_
