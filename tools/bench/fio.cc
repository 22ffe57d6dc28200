#include "tools/bench/fio.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata {

absl::StatusOr<double> Fio(const std::string& dir, const std::string& rw, uint64_t io_bytes,
                           unsigned queue_depth) {
  std::string command = absl::StrCat(
      "fio --name=strata --directory=", dir, " --filename=strata-fio.data --size=2G",
      " --bs=", io_bytes, " --iodepth=", queue_depth, " --ioengine=io_uring --direct=1 --rw=", rw,
      " --runtime=4 --time_based --output-format=json 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::FailedPreconditionError("cannot run fio");
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  if (pclose(pipe) != 0) {
    return absl::FailedPreconditionError(
        "fio failed or is not installed (deploy/install-deps.sh installs it)");
  }
  nlohmann::json result = nlohmann::json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.contains("jobs")) {
    return absl::InternalError("fio printed no JSON");
  }
  return result["jobs"][0][rw]["bw_bytes"].get<double>() / 1e9;
}

}  // namespace strata
