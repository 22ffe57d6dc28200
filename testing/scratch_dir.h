// ScratchDir: a fresh, empty directory for one test's files under gtest's
// TempDir() ($TEST_TMPDIR, else /tmp), removed with everything in it when the
// ScratchDir goes. It is kept, and its path printed, when the test has failed
// or STRATA_KEEP_TEST_DIRS is set, so that the logs in it can be read.
// Declare it before whatever writes into it (a Processes, a cluster, a tier)
// so that those end first. Not thread-safe.
#ifndef STRATA_TESTING_SCRATCH_DIR_H_
#define STRATA_TESTING_SCRATCH_DIR_H_

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace strata::testing {

class ScratchDir {
 public:
  // TempDir()/`name`_<pid>_<n>, n counting the process's ScratchDirs.
  explicit ScratchDir(const std::string& name) : path_(UniquePath(name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    if (::testing::Test::HasFailure() || getenv("STRATA_KEEP_TEST_DIRS") != nullptr) {
      std::fprintf(stderr, "test files kept in %s\n", path_.c_str());
      return;
    }
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }

 private:
  static std::string UniquePath(const std::string& name) {
    static std::atomic<int> count{0};
    const std::string leaf = name + "_" + std::to_string(getpid()) + "_" + std::to_string(count++);
    return (std::filesystem::path(::testing::TempDir()) / leaf).string();
  }

  const std::string path_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_SCRATCH_DIR_H_
