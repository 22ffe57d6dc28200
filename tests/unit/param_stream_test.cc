// ParamStream (client/param_stream.h) over a scripted collective standing in
// for rank 0 of two: the other rank's part of each bucket is a value known
// per bucket, and a bucket's all-gather can be held back or made to fail.
// A range is ready once the buckets up to its end are gathered, whatever
// comes after; an error stops the buckets after it and is reported for the
// ranges it did not reach.
#include "client/param_stream.h"

#include <cstring>
#include <set>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr uint64_t kBucketParams = 64;

// Rank 0 of 2: AllGatherV puts the input first and fills rank 1's part with
// OtherRankValue(bucket). The all-gather of bucket `held` waits for
// `release`; that of bucket `failing` returns UNAVAILABLE.
class ScriptedCollective : public Collective {
 public:
  static float OtherRankValue(size_t bucket) { return 1000.0f + static_cast<float>(bucket); }

  ScriptedCollective(const float* params_base, size_t held, size_t failing)
      : params_base_(params_base), held_(held), failing_(failing) {}

  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllGatherV(DType dtype, const void* input, void* output,
                          absl::Span<const size_t> counts) override {
    EXPECT_EQ(dtype, DType::kFp32);
    const size_t bucket =
        static_cast<size_t>(static_cast<const float*>(output) - params_base_) / kBucketParams;
    gathered_.insert(bucket);
    if (bucket == held_) release.WaitForNotification();
    if (bucket == failing_) return absl::UnavailableError("worker lost");
    float* out = static_cast<float*>(output);
    std::memcpy(out, input, counts[0] * sizeof(float));
    for (size_t i = 0; i < counts[1]; ++i) out[counts[0] + i] = OtherRankValue(bucket);
    return absl::OkStatus();
  }
  absl::Status ReduceScatterSum(DType, void*, size_t) override { return Unused(); }
  absl::Status ReduceScatterSumV(DType, void*, absl::Span<const size_t>) override {
    return Unused();
  }
  absl::Status AllGather(DType, void*, size_t) override { return Unused(); }
  absl::Status AllReduceSum(absl::Span<double>) override { return Unused(); }
  absl::Status Barrier() override { return Unused(); }
  void Abort() override {}

  // The buckets whose all-gather ran (collective thread; read once idle).
  const std::set<size_t>& gathered() const { return gathered_; }
  absl::Notification release;

 private:
  static absl::Status Unused() { return absl::InternalError("not used by ParamStream"); }

  const float* const params_base_;
  const size_t held_, failing_;
  std::set<size_t> gathered_;
};

class ParamStreamTest : public ::testing::Test {
 protected:
  ParamStreamTest()
      : layout_(*FlatLayout::Create({{"w", {20, 30}}, {"b", {30}}}, 256)),
        slice_(layout_.WorkerSlice(0, 2)),
        buckets_(layout_.PaddedNumParams(2), kBucketParams),
        params_(layout_.PaddedNumParams(2), -1.0f) {
    for (uint64_t i = slice_.begin; i < slice_.end; ++i) params_[i] = static_cast<float>(i);
  }

  ParamStream::Context Context(Collective* collective) {
    ParamStream::Context context;
    context.collective = collective;
    context.layout = &layout_;
    context.dtype = DType::kFp32;
    context.rank = 0;
    context.world_size = 2;
    context.buckets = buckets_;
    context.params = reinterpret_cast<uint8_t*>(params_.data());
    context.device = device_.get();
    context.scratch = &scratch_;
    context.thread = &thread_;
    return context;
  }

  // The value the flat index holds once its bucket is gathered (padding
  // past the flat space is no rank's and stays as it was).
  float Want(uint64_t i) const {
    if (i >= layout_.num_params()) return -1.0f;
    return i < slice_.end ? static_cast<float>(i)
                          : ScriptedCollective::OtherRankValue(buckets_.BucketOf(i));
  }

  const FlatLayout layout_;
  const FlatRange slice_;
  const Buckets buckets_;
  std::vector<float> params_;
  const std::unique_ptr<Device> device_ = HostDevice();
  DeviceMemory scratch_;
  ThreadPool thread_{1};
};

TEST_F(ParamStreamTest, ARangeIsReadyOnceItsBucketsAreWhateverComesAfter) {
  ASSERT_GE(buckets_.size(), 10u);
  const size_t held = buckets_.size() - 2;  // its rank-1 part is the other rank's
  ASSERT_GT(buckets_.bucket(held).begin, slice_.end);
  ScriptedCollective collective(params_.data(), held, /*failing=*/buckets_.size());
  ParamStream stream(Context(&collective));
  const FlatRange before_held{0, buckets_.bucket(held).begin};
  ASSERT_TRUE(stream.WaitFor(before_held).ok());
  for (uint64_t i = before_held.begin; i < before_held.end; ++i) {
    ASSERT_EQ(params_[i], Want(i)) << "flat index " << i;
  }
  // The held bucket and those after it are not gathered yet.
  for (uint64_t i = before_held.end; i < params_.size(); ++i) ASSERT_EQ(params_[i], -1.0f) << i;
  collective.release.Notify();
  ASSERT_TRUE(stream.WaitFor({0, params_.size()}).ok());
  ASSERT_TRUE(stream.WaitAll().ok());
  for (uint64_t i = 0; i < params_.size(); ++i) ASSERT_EQ(params_[i], Want(i)) << i;
}

TEST_F(ParamStreamTest, AFailedBucketEndsTheStreamAndIsReportedPastIt) {
  const size_t failing = buckets_.size() / 2 + 1;
  ScriptedCollective collective(params_.data(), /*held=*/buckets_.size(), failing);
  collective.release.Notify();
  ParamStream stream(Context(&collective));
  EXPECT_TRUE(stream.WaitFor({0, buckets_.bucket(failing).begin}).ok());
  absl::Status s = stream.WaitFor({0, buckets_.bucket(failing).end});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  s = stream.WaitAll();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  // No bucket after the failed one ran its all-gather.
  EXPECT_EQ(*collective.gathered().rbegin(), failing);
  EXPECT_EQ(collective.gathered().size(), failing + 1);
}

}  // namespace
}  // namespace strata
