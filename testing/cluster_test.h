// LocalClusterTest: a GoogleTest fixture, parameterized by `Param`, that
// starts a LocalCluster of two shard servers (64 MiB host budget each, one
// executor thread) before each test and stops it after.
#ifndef STRATA_TESTING_CLUSTER_TEST_H_
#define STRATA_TESTING_CLUSTER_TEST_H_

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "testing/local_cluster.h"

namespace strata::testing {

template <typename Param>
class LocalClusterTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  std::unique_ptr<LocalCluster> cluster_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_CLUSTER_TEST_H_
