#include "storage/uring_submit.h"

#include <cerrno>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace strata {

int SubmitQueued(io_uring* ring) {
  while (io_uring_sq_ready(ring) > 0) {
    const int r = io_uring_submit(ring);
    if (r > 0) continue;
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) return r;
    absl::SleepFor(absl::Milliseconds(1));  // took none: a moment for the kernel
  }
  return 0;
}

}  // namespace strata
