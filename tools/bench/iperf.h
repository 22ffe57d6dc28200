// iperf3, the network's limit for the strata-bench commands that move
// bytes between processes: single-stream TCP bandwidth on loopback, or to
// another host. Stateless.
#ifndef STRATA_TOOLS_BENCH_IPERF_H_
#define STRATA_TOOLS_BENCH_IPERF_H_

#include <string>

namespace strata {

// Single-stream loopback TCP bandwidth in GB/s from a 2 s iperf3 run, or a
// negative value when iperf3 is not installed or fails.
double MeasureIperf3();

// Single-stream TCP bandwidth in GB/s to the `iperf3 -s` serving at
// HOST:PORT `server` (2 s), or a negative value when it cannot be measured.
double MeasureIperf3To(const std::string& server);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_IPERF_H_
