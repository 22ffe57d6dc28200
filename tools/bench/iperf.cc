#include "tools/bench/iperf.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace strata {

double MeasureIperf3To(const std::string& server) {
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return -1;
  std::string client = absl::StrCat("iperf3 -c ", server.substr(0, colon), " -p ",
                                    server.substr(colon + 1), " -t 2 -J 2>/dev/null");
  FILE* pipe = popen(client.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  if (pclose(pipe) != 0) return -1;
  nlohmann::json result = nlohmann::json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (result.is_discarded() || !result.contains("end")) return -1;
  return result["end"]["sum_received"]["bits_per_second"].get<double>() / 8e9;
}

double MeasureIperf3() {
  int port = 20000 + static_cast<int>(std::random_device{}() % 20000);
  std::string server = absl::StrCat("iperf3 -s -1 -p ", port, " >/dev/null 2>&1 &");
  if (std::system(server.c_str()) != 0) return -1;
  absl::SleepFor(absl::Milliseconds(300));
  return MeasureIperf3To(absl::StrCat("127.0.0.1:", port));
}

}  // namespace strata
