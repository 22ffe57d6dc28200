// The seed of a randomized test: random, printed so that a failure can be
// replayed, and taken from STRATA_TEST_SEED when that is set (the replay).
// Header-only (target strata_test_seed); thread-safe.
#ifndef STRATA_TESTING_TEST_SEED_H_
#define STRATA_TESTING_TEST_SEED_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace strata {
namespace testing {

inline uint32_t TestSeed() {
  const char* given = std::getenv("STRATA_TEST_SEED");
  const uint32_t seed = given != nullptr ? static_cast<uint32_t>(std::strtoul(given, nullptr, 10))
                                         : std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

}  // namespace testing
}  // namespace strata

#endif  // STRATA_TESTING_TEST_SEED_H_
