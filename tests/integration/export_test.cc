// `stratactl export` writes a job's master weights (and Adam moments) at one
// step as safetensors: the file is read back here with an independent parser
// and compared with the servers' state, tensor by tensor, bit for bit.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "strata/client.h"
#include "testing/job_runner.h"
#include "testing/local_cluster.h"
#include "testing/processes.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

std::pair<int, std::string> Stratactl(const std::string& args) {
  return testing::RunCommand(absl::StrCat(STRATA_BIN_DIR, "/stratactl ", args));
}

TEST(ExportTest, SafetensorsHoldEveryTensorAtOneStep) {
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o;
  o.coordinator_address = (*cluster)->coordinator_address();
  o.job_id = "export-job";
  o.job.tensors = testing::SmallModel();
  o.job.world_size = 2;
  o.job.chunk_num_params = 256;
  FlatLayout layout = *FlatLayout::Create(o.job.tensors, 256);
  o.initial.params = testing::InitialParams(layout.num_params());
  testing::RunResult run = testing::RunWorkers(o, 3, 1, [&](int rank, int64_t step, int m) {
    return testing::Gradient(layout.num_params(), rank, step, m);
  });
  ASSERT_EQ(run.master.step, 3);

  const testing::ScratchDir scratch("export_test");
  const std::string& dir = scratch.path();
  auto [code, output] = Stratactl(absl::StrCat("--coordinator=", o.coordinator_address,
                                               " --job=export-job --out=", dir,
                                               " --with_optimizer_state --json export"));
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, HasSubstr("\"step\":3"));

  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GE(file.size(), 8u);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, file.data(), 8);
  ASSERT_EQ(header_bytes % 8, 0u);
  nlohmann::json header = nlohmann::json::parse(file.substr(8, header_bytes));
  const char* data = file.data() + 8 + header_bytes;
  EXPECT_EQ(header["__metadata__"]["strata_step"], "3");
  EXPECT_EQ(header.size(), 1 + 3 * o.job.tensors.size());
  uint64_t total = 0;
  for (size_t i = 0; i < o.job.tensors.size(); ++i) {
    const TensorSpec& t = o.job.tensors[i];
    const FlatRange range = layout.tensor_range(i);
    for (const auto& [suffix, source] :
         std::vector<std::pair<std::string, const std::vector<float>*>>{
             {"", &run.master.params},
             {".exp_avg", &run.master.exp_avg},
             {".exp_avg_sq", &run.master.exp_avg_sq}}) {
      const nlohmann::json& entry = header.at(t.name + suffix);
      EXPECT_EQ(entry["dtype"], "F32");
      EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), t.shape);
      uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
      ASSERT_EQ(end - begin, range.size() * sizeof(float)) << t.name << suffix;
      ASSERT_LE(8 + header_bytes + end, file.size());
      EXPECT_EQ(std::memcmp(data + begin, source->data() + range.begin, end - begin), 0)
          << t.name << suffix;
      total += end - begin;
    }
  }
  EXPECT_EQ(8 + header_bytes + total, file.size());
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.tmp"));

  // Bad input: an unknown job, a directory that cannot be made; nothing written.
  auto [unknown_code, unknown] = Stratactl(absl::StrCat(
      "--coordinator=", o.coordinator_address, " --job=nope --out=", dir, "/other export"));
  EXPECT_EQ(unknown_code, 1);
  EXPECT_THAT(unknown, HasSubstr("NOT_FOUND"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/other"));
  auto [file_code, file_error] =
      Stratactl(absl::StrCat("--coordinator=", o.coordinator_address,
                             " --job=export-job --out=", dir, "/model.safetensors/x export"));
  EXPECT_EQ(file_code, 1);
  EXPECT_THAT(file_error, HasSubstr("cannot create directory"));
}

// A new job started from an export (weights and moments) continues exactly as
// the exported job would have: its state equals, bit for bit, that of a job
// that ran every step.
TEST(ExportTest, ANewJobStartedFromAnExportContinuesBitwise) {
  auto cluster = LocalCluster::Start({2, uint64_t{64} << 20, 1});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o;
  o.coordinator_address = (*cluster)->coordinator_address();
  o.job.tensors = testing::SmallModel();
  o.job.world_size = 2;
  o.job.chunk_num_params = 256;
  FlatLayout layout = *FlatLayout::Create(o.job.tensors, 256);
  auto gradient = [&](int rank, int64_t step, int m) {
    return testing::Gradient(layout.num_params(), rank, step, m);
  };
  ClientOptions first = o, whole = o, second = o;
  first.job_id = "first-three";
  whole.job_id = "all-five";
  first.initial.params = whole.initial.params = testing::InitialParams(layout.num_params());
  ASSERT_EQ(testing::RunWorkers(first, 3, 1, gradient).master.step, 3);
  MasterState want = testing::RunWorkers(whole, 5, 1, gradient).master;

  const testing::ScratchDir scratch("import_test");
  const std::string& dir = scratch.path();
  auto [code, output] =
      Stratactl(absl::StrCat("--coordinator=", o.coordinator_address,
                             " --job=first-three --out=", dir, " --with_optimizer_state export"));
  ASSERT_EQ(code, 0) << output;
  second.job_id = "last-two";
  second.initial.safetensors_path = dir + "/model.safetensors";
  // RunWorkers numbers steps from 1: these are steps 4 and 5.
  MasterState got = testing::RunWorkers(second, 2, 1, [&](int rank, int64_t step, int m) {
                      return gradient(rank, step + 3, m);
                    }).master;
  EXPECT_EQ(got.step, 5);
  // Tensor by tensor (the test's gradients also fill the alignment padding
  // between tensors, which an export does not carry).
  for (size_t i = 0; i < o.job.tensors.size(); ++i) {
    FlatRange r = layout.tensor_range(i);
    for (const auto& [name, g, w] :
         std::vector<std::tuple<const char*, const std::vector<float>*, const std::vector<float>*>>{
             {"params", &got.params, &want.params},
             {"exp_avg", &got.exp_avg, &want.exp_avg},
             {"exp_avg_sq", &got.exp_avg_sq, &want.exp_avg_sq}}) {
      EXPECT_TRUE(std::equal(g->begin() + r.begin, g->begin() + r.end, w->begin() + r.begin))
          << o.job.tensors[i].name << " " << name;
    }
  }

  // A model that does not match the file is refused, naming the tensor.
  ClientOptions other = second;
  other.job_id = "mismatched";
  other.job.world_size = 1;
  other.job.tensors[0].shape = {37, 30};
  auto refused = Client::Connect(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("tensor 'w1'"));
  other.job.tensors = testing::SmallModel();
  other.job_id = "missing-file";
  other.initial.safetensors_path = dir + "/nope.safetensors";
  EXPECT_EQ(Client::Connect(other).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata
