// iperf3, the network's limit for the strata-bench commands that move
// bytes between processes: single-stream TCP bandwidth on loopback.
// Stateless.
#ifndef STRATA_TOOLS_BENCH_IPERF_H_
#define STRATA_TOOLS_BENCH_IPERF_H_

namespace strata {

// Single-stream loopback TCP bandwidth in GB/s from a 2 s iperf3 run, or a
// negative value when iperf3 is not installed or fails.
double MeasureIperf3();

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_IPERF_H_
