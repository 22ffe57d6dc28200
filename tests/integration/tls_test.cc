// TLS between every strata process: a job trains over TLS exactly as over
// plaintext, a checkpoint (coordinator to servers, mutual TLS) works, and
// clients that do not trust the cluster's CA, present a certificate of
// another CA, or speak plaintext are refused with a message that says so.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/grpc_util.h"
#include "strata/client.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/scratch_dir.h"
#include "testing/test_certificates.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 3;

std::vector<float> Gradient(int rank, int64_t step, int micro) {
  return testing::Gradient(FlatLayout::Create(testing::SmallModel(), 256)->num_params(), rank, step,
                           micro);
}

ClientOptions TlsJob(const LocalCluster& cluster, const std::string& dir) {
  ClientOptions o = testing::SmallFp32Job(cluster.coordinator_address(), "tls");
  o.initial.params = testing::InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
  o.tls_ca_file = dir + "/ca.pem";
  return o;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certificates_.Make().ok()) << certificates_.Make();
    LocalClusterOptions options;
    options.coordinator_tls = certificates_.Files("coordinator");
    options.server_tls = certificates_.Files("server");
    auto cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  // ListJobs at the coordinator with `credentials`.
  absl::Status ListJobs(const ChannelCredentials& credentials) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), credentials));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::ListJobsResponse response;
    return FromGrpcStatus(stub->ListJobs(&context, v1::ListJobsRequest(), &response));
  }

  const testing::ScratchDir scratch_{"tls_test"};
  testing::TestCertificates certificates_{scratch_.path()};
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(TlsTest, TrainsAndCheckpointsAsInPlaintext) {
  const testing::RunResult tls =
      testing::RunWorkers(TlsJob(*cluster_, scratch_.path()), kSteps, 1, Gradient);
  auto plaintext_cluster = LocalCluster::Start({});
  ASSERT_TRUE(plaintext_cluster.ok());
  ClientOptions plain = TlsJob(**plaintext_cluster, scratch_.path());
  plain.tls_ca_file.clear();
  const testing::RunResult plaintext = testing::RunWorkers(plain, kSteps, 1, Gradient);
  ASSERT_EQ(tls.master.step, kSteps);
  EXPECT_EQ(tls.master.params, plaintext.master.params);
  EXPECT_EQ(tls.master.exp_avg_sq, plaintext.master.exp_avg_sq);

  // A checkpoint: the coordinator calls every server over mutual TLS.
  auto credentials = MakeChannelCredentials(TlsFiles{"", "", scratch_.path() + "/ca.pem"});
  ASSERT_TRUE(credentials.ok());
  auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), *credentials));
  grpc::ClientContext context;
  v1::SaveCheckpointRequest save;
  save.set_job_id("tls");
  save.set_dir(scratch_.path() + "/checkpoints");
  v1::CheckpointInfo info;
  absl::Status saved = FromGrpcStatus(stub->SaveCheckpoint(&context, save, &info));
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(info.step(), kSteps);
}

TEST_F(TlsTest, ClientsThatDoNotShareTheCaAreRefused) {
  auto trusting = MakeChannelCredentials(TlsFiles{"", "", scratch_.path() + "/ca.pem"});
  ASSERT_TRUE(trusting.ok());
  EXPECT_TRUE(ListJobs(*trusting).ok());
  // Plaintext against a TLS server.
  absl::Status s = ListJobs(PlaintextCredentials());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // A client that trusts another CA: the server's certificate is not verified.
  auto other_ca = MakeChannelCredentials(TlsFiles{"", "", scratch_.path() + "/other-ca.pem"});
  ASSERT_TRUE(other_ca.ok());
  s = ListJobs(*other_ca);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // A client certificate of another CA: the server refuses the handshake.
  auto foreign = MakeChannelCredentials(certificates_.Files("other-client"));
  ASSERT_TRUE(foreign.ok());
  s = ListJobs(*foreign);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;

  // The client library says what went wrong.
  ClientOptions o = TlsJob(*cluster_, scratch_.path());
  o.job.world_size = 1;
  o.rendezvous_timeout = absl::Seconds(3);
  o.tls_ca_file.clear();
  auto plaintext = Client::Connect(o);
  ASSERT_FALSE(plaintext.ok());
  EXPECT_THAT(plaintext.status().message(), HasSubstr("TLS")) << plaintext.status();
  o.tls_ca_file = scratch_.path() + "/no-such-ca.pem";
  auto missing = Client::Connect(o);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls_ca"));
}

TEST(TlsStartUpTest, ADaemonWithUnusableTlsFilesDoesNotStart) {
  const testing::ScratchDir scratch("tls_start_up_test");
  CoordinatorOptions options;
  options.data_dir = scratch.path() + "/coordinator";
  options.tls = TlsFiles{scratch.path() + "/missing.pem", scratch.path() + "/missing.key",
                         scratch.path() + "/missing-ca.pem"};
  auto coordinator = Coordinator::Start(options);
  ASSERT_FALSE(coordinator.ok());
  EXPECT_EQ(coordinator.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(coordinator.status().message(), HasSubstr("--tls_"));
}

}  // namespace
}  // namespace strata
