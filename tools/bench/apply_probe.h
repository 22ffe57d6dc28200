// The apply's cost floor: the time of the fused AdamW kernel alone over N
// parameters (their gradients and low-precision copies in `dtype`, states
// in FP32), in memory already faulted in, spread over T threads. Every copy
// of a chunk runs it once a step, so a step with one more copy of every
// chunk spends at least its one-thread time more CPU-seconds.
#ifndef STRATA_TOOLS_BENCH_APPLY_PROBE_H_
#define STRATA_TOOLS_BENCH_APPLY_PROBE_H_

#include <cstdint>

#include "strata/types.h"

namespace strata {

// Seconds of one AdamW step over `num_params` parameters, cut in `threads`
// equal ranges run at once. Allocates 16 bytes per parameter meanwhile.
double MeasureApplySeconds(uint64_t num_params, DType dtype, int threads);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_APPLY_PROBE_H_
