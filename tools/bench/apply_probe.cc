#include "tools/bench/apply_probe.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "kernels/adam.h"

namespace strata {

double MeasureApplySeconds(uint64_t num_params, DType dtype, int threads) {
  std::vector<float> p(num_params, 0.5f), m(num_params, 0.0f), v(num_params, 0.0f);
  std::vector<uint16_t> g(num_params, 0x3c00), copy(num_params);
  AdamConstants c = MakeAdamConstants(AdamConfig{}, 1, 1.0f);
  absl::Time started = absl::Now();
  std::vector<std::thread> pool;
  uint64_t per = (num_params + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint64_t begin = std::min(num_params, t * per), end = std::min(num_params, begin + per);
      AdamUpdate(c, dtype, g.data() + begin, p.data() + begin, m.data() + begin, v.data() + begin,
                 dtype, copy.data() + begin, end - begin);
    });
  }
  for (auto& t : pool) t.join();
  return absl::ToDoubleSeconds(absl::Now() - started);
}

}  // namespace strata
