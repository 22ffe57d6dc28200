// SubmitQueued: hands the kernel every request queued in an io_uring's
// submission queue. io_uring_submit() may take only some of them, or none
// (EINTR: a signal came; EAGAIN: the kernel lacked memory for a moment;
// EBUSY: completions must be reaped first), and a request left in the queue
// never completes: whoever waits for it waits forever. Thread-safety: that
// of the ring's submission side (one caller at a time).
#ifndef STRATA_STORAGE_URING_SUBMIT_H_
#define STRATA_STORAGE_URING_SUBMIT_H_

#include <liburing.h>

namespace strata {

// Submits until the queue is empty, retrying (1 ms apart) what the kernel
// did not take for one of the reasons above: 0, or -errno of any other
// error, with the requests not taken still queued.
int SubmitQueued(io_uring* ring);

}  // namespace strata

#endif  // STRATA_STORAGE_URING_SUBMIT_H_
