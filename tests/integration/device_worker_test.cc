// A worker whose buffers live on a GPU (ClientOptions::device "cuda:0",
// NCCL reducing and gathering in place, its slice crossing through pinned
// host memory) against a worker on the host (Gloo) over the same gradients:
// the same master weights, moments, gradient norms and parameters, bit for
// bit -- accumulated and streamed steps, replicated and on-demand
// parameters, FP16 and BF16. Skips itself where no GPU is present. The
// refusals of a device a worker cannot use run everywhere.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/device.h"
#include "gtest/gtest.h"
#include "testing/cluster_test.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"

namespace strata {
namespace {

using testing::Gradient;

constexpr int kSteps = 5;

struct Mode {
  DType dtype;
  ParamResidency params;
  bool streamed;
};

std::string Name(const Mode& mode) {
  return absl::StrCat(DTypeName(mode.dtype),
                      mode.params == ParamResidency::kOnDemand ? "OnDemand" : "Replicated",
                      mode.streamed ? "Streamed" : "Accumulated");
}
std::string ModeName(const ::testing::TestParamInfo<Mode>& info) { return Name(info.param); }

// What a run saw: each step's result and the parameters after it, as FP32.
struct Training {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> params;
  MasterState master;
};

// Floats the client reads or fills, in `device`'s memory.
class Floats {
 public:
  Floats(Device* device, size_t n) : device_(device), n_(n) {
    absl::StatusOr<DeviceMemory> memory = device->Allocate(n * sizeof(float));
    EXPECT_TRUE(memory.ok()) << memory.status();
    if (memory.ok()) memory_ = std::move(*memory);
  }
  void Set(absl::Span<const float> values) {
    EXPECT_TRUE(device_->Copy(memory_.data(), values.data(), n_ * sizeof(float)).ok());
  }
  std::vector<float> Get() const {
    std::vector<float> values(n_);
    EXPECT_TRUE(device_->Copy(values.data(), memory_.data(), n_ * sizeof(float)).ok());
    return values;
  }
  absl::Span<float> span() { return {reinterpret_cast<float*>(memory_.data()), n_}; }

 private:
  Device* device_;
  size_t n_;
  DeviceMemory memory_;
};

class DeviceWorkerTest : public testing::LocalClusterTest<Mode> {
 protected:
  Training Train(const std::string& device_name, const std::string& collective) {
    const Mode mode = GetParam();
    ClientOptions o;
    o.coordinator_address = cluster_->coordinator_address();
    o.job_id = absl::StrCat(device_name == "cpu" ? "host-" : "device-", Name(mode));
    o.job.tensors = testing::SmallModel();
    o.job.chunk_num_params = 256;
    o.bucket_num_params = 192;  // buckets, chunks and tensors cut differently
    o.job.dtype = mode.dtype;
    o.params = mode.params;
    o.max_grad_norm = 0.5;  // clips: the norm's bits count
    o.job.adam.weight_decay = 0.01f;
    o.initial.params = testing::InitialParams(FlatLayout::Create(o.job.tensors, 256)->num_params());
    o.device = device_name;
    o.collective = collective;
    Training run;
    absl::StatusOr<std::unique_ptr<Device>> device = OpenDevice(device_name);
    EXPECT_TRUE(device.ok()) << device.status();
    if (!device.ok()) return run;
    absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(o);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (!connected.ok()) return run;
    Client& c = **connected;
    const FlatLayout& layout = c.layout();
    const uint64_t n = layout.num_params();
    Floats grads(device->get(), n), params(device->get(), n);
    for (int s = 1; s <= kSteps; ++s) {
      grads.Set(Gradient(n, 0, s, 0));
      EXPECT_TRUE(c.AccumulateGradients(grads.span()).ok());
      grads.Set(Gradient(n, 0, s, 1));
      if (mode.streamed) {
        for (size_t t = layout.tensors().size(); t-- > 0;) {  // backward's order
          const FlatRange r = layout.tensor_range(t);
          absl::Status ready = c.GradientsReady(r, grads.span().subspan(r.begin, r.size()));
          EXPECT_TRUE(ready.ok()) << ready;
        }
      } else {
        EXPECT_TRUE(c.AccumulateGradients(grads.span()).ok());
      }
      absl::StatusOr<StepResult> step = c.Step();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) return run;
      run.steps.push_back(*step);
      absl::Status read = mode.params == ParamResidency::kOnDemand
                              ? c.GatherParams({0, n}, params.span())
                              : c.CopyParams(params.span());
      EXPECT_TRUE(read.ok()) << read;
      run.params.push_back(params.Get());
    }
    absl::StatusOr<MasterState> master = c.ReadMasterState();
    EXPECT_TRUE(master.ok()) << master.status();
    if (master.ok()) run.master = *std::move(master);
    return run;
  }
};

TEST_P(DeviceWorkerTest, TrainsTheHostWorkersMasterStateBitForBit) {
  absl::StatusOr<std::unique_ptr<Device>> gpu = OpenDevice("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << gpu.status();
  const Training host = Train("cpu", "gloo");
  const Training device = Train("cuda:0", "nccl");
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(device.steps.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(host.steps.size(), device.steps.size());
  for (size_t i = 0; i < host.steps.size(); ++i) {
    EXPECT_EQ(device.steps[i].grad_norm, host.steps[i].grad_norm) << "step " << i + 1;
    EXPECT_EQ(device.steps[i].clip_factor, host.steps[i].clip_factor) << "step " << i + 1;
    EXPECT_EQ(device.params[i], host.params[i]) << "step " << i + 1;
  }
  EXPECT_EQ(device.master.step, kSteps);
  EXPECT_EQ(device.master.params, host.master.params);
  EXPECT_EQ(device.master.exp_avg, host.master.exp_avg);
  EXPECT_EQ(device.master.exp_avg_sq, host.master.exp_avg_sq);
  // The steps did something: the weights moved from their start.
  EXPECT_NE(device.master.params, testing::InitialParams(device.master.params.size()));
}

INSTANTIATE_TEST_SUITE_P(Modes, DeviceWorkerTest,
                         ::testing::Values(Mode{DType::kFp16, ParamResidency::kReplicated, false},
                                           Mode{DType::kFp16, ParamResidency::kReplicated, true},
                                           Mode{DType::kBf16, ParamResidency::kOnDemand, false},
                                           Mode{DType::kBf16, ParamResidency::kOnDemand, true}),
                         ModeName);

// A GPU worker reads and writes the caller's floats on the GPU: host memory
// is refused, naming the device, and changes nothing.
TEST(DeviceOptionTest, AGpuWorkerRefusesHostMemory) {
  absl::StatusOr<std::unique_ptr<Device>> gpu = OpenDevice("cuda:0");
  if (!gpu.ok()) GTEST_SKIP() << gpu.status();
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "host-memory");
  o.job.world_size = 1;
  o.device = "cuda:0";
  o.collective = "nccl";
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& c = **connected;
  const uint64_t n = c.layout().num_params();
  std::vector<float> host(n, 1.0f);
  for (absl::Status s :
       {c.AccumulateGradients(host), c.GradientsReady({0, n}, host),
        c.CopyParams(absl::MakeSpan(host)), c.StartGather({0, n}, absl::MakeSpan(host))->Wait()}) {
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("cuda:0's memory"), std::string::npos) << s;
  }
  EXPECT_EQ(host, std::vector<float>(n, 1.0f));
  // Nothing was accumulated: a step now has no gradients.
  EXPECT_TRUE(absl::IsFailedPrecondition(c.Step().status()));
  Floats grads(gpu->get(), n);
  grads.Set(Gradient(n, 0, 1, 0));
  ASSERT_TRUE(c.AccumulateGradients(grads.span()).ok());
  ASSERT_TRUE(c.Step().ok());
}

TEST(DeviceOptionTest, ConnectRefusesADeviceItCannotUseAndNamesIt) {
  auto cluster = LocalCluster::Start({1, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o = testing::SmallFp32Job((*cluster)->coordinator_address(), "refused");
  o.job.world_size = 1;
  o.device = "tpu:0";
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("device 'tpu:0'"), std::string::npos) << c.status();

  o.device = "cuda:0";
  o.collective = "gloo";
  c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  if (OpenDevice("cuda:0").ok()) {
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
    EXPECT_NE(c.status().message().find("needs collective nccl"), std::string::npos) << c.status();
  } else {  // no GPU here: that is what it says
    EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
    EXPECT_NE(c.status().message().find("cuda:0"), std::string::npos) << c.status();
  }
  // Nothing was made: the job is not there, and a good worker creates it.
  o.device = "cpu";
  c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->step(), 0);
}

}  // namespace
}  // namespace strata
