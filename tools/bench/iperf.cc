#include "tools/bench/iperf.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

// The ways iperf3 drives TCP: its arguments beyond the server's.
constexpr const char* kWays[] = {"", "-l 1M", "-P 4 -l 1M"};

// GB/s of one 2 s iperf3 run with `way` to `host`:`port`, or -1.
double RunClient(const std::string& host, const std::string& port, const char* way) {
  std::string client =
      absl::StrCat("iperf3 -c ", host, " -p ", port, " -t 2 ", way, " -J 2>/dev/null");
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

}  // namespace

double MeasureIperf3To(const std::string& server) {
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return -1;
  const std::string host = server.substr(0, colon), port = server.substr(colon + 1);
  double best = -1;
  for (const char* way : kWays) best = std::max(best, RunClient(host, port, way));
  return best;
}

double MeasureIperf3() {
  const int port = 20000 + static_cast<int>(std::random_device{}() % 20000);
  // A server that serves each way's run, then is stopped.
  const std::string server = absl::StrCat("iperf3 -s -p ", port, " >/dev/null 2>&1 & echo $!");
  FILE* pipe = popen(server.c_str(), "r");
  if (pipe == nullptr) return -1;
  long pid = 0;
  const bool started = std::fscanf(pipe, "%ld", &pid) == 1;
  pclose(pipe);
  if (!started || pid <= 0) return -1;
  absl::SleepFor(absl::Milliseconds(300));
  const double gbps = MeasureIperf3To(absl::StrCat("127.0.0.1:", port));
  kill(static_cast<pid_t>(pid), SIGTERM);
  return gbps;
}

}  // namespace strata
