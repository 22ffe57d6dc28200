// iperf3, the network's limit for the strata-bench commands that move
// bytes between processes: TCP bandwidth on loopback, or to another host.
// The limit is the best iperf3 reaches, so each measurement tries the ways
// a sender can drive TCP (one stream and several, 128 KiB and 1 MiB writes:
// gRPC writes up to megabytes per sendmsg over several connections, and on
// some machines iperf3's 128 KiB default is bound by its syscalls, not by
// TCP). Stateless.
#ifndef STRATA_TOOLS_BENCH_IPERF_H_
#define STRATA_TOOLS_BENCH_IPERF_H_

#include <string>

namespace strata {

// Loopback TCP bandwidth in GB/s: the best of 2 s iperf3 runs in each way
// (about 8 s in all), or a negative value when iperf3 is not installed or
// fails.
double MeasureIperf3();

// The same to the `iperf3 -s` serving at HOST:PORT `server`, or a negative
// value when it cannot be measured.
double MeasureIperf3To(const std::string& server);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_IPERF_H_
