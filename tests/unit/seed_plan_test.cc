// Seed plans (coordinator/seed_plan.h): new copies come from their chunk's
// first live old copy, and old copies that a step cut short left apart
// from that source -- at another step, or at the same step applied by
// another round -- are named to be seeded again from it.
#include "coordinator/seed_plan.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A job of `copies.size()` chunks; chunk i's copies on copies[i] (first:
// the primary).
v1::JobInfo Job(const std::vector<std::vector<std::string>>& copies) {
  v1::JobInfo job;
  job.mutable_spec()->set_job_id("j");
  job.mutable_spec()->set_replicas(2);
  for (size_t i = 0; i < copies.size(); ++i) {
    v1::ChunkAssignment* c = job.add_chunks();
    c->mutable_chunk()->set_chunk_id(static_cast<uint32_t>(i));
    c->mutable_chunk()->set_flat_begin(i * 100);
    c->mutable_chunk()->set_num_params(100);
    c->set_server_address(copies[i][0]);
    for (size_t k = 1; k < copies[i].size(); ++k) c->add_replica_addresses(copies[i][k]);
  }
  return job;
}

// A ListChunks row: chunk `id` at `step`, applied by (`generation`,
// `attempt`), or written (generation 0: no round).
v1::ChunkStatus Row(uint32_t id, int64_t step, uint64_t generation, uint32_t attempt = 0) {
  v1::ChunkStatus row;
  row.mutable_chunk()->set_chunk_id(id);
  row.mutable_chunk()->set_flat_begin(id * 100);
  row.mutable_chunk()->set_num_params(100);
  row.set_applied_step(step);
  if (generation > 0) {
    row.mutable_applied_round()->set_generation(generation);
    row.mutable_applied_round()->set_attempt(attempt);
  }
  return row;
}

IsLost LostAre(std::set<std::string> lost) {
  return [lost](const std::string& address) { return lost.count(address) > 0; };
}

std::vector<uint32_t> Ids(const std::vector<v1::ChunkSpec>& chunks) {
  std::vector<uint32_t> ids;
  for (const v1::ChunkSpec& c : chunks) ids.push_back(c.chunk_id());
  return ids;
}

TEST(SeedPlanTest, NewCopiesComeFromTheFirstLiveOldCopy) {
  const v1::JobInfo before = Job({{"a", "b"}, {"b", "c"}});
  const v1::JobInfo after = Job({{"b", "d"}, {"c", "d"}});
  absl::StatusOr<SeedPlan> plan = PlanSeeds(before, after, LostAre({"a"}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Chunk 0's first copy is lost; chunk 1's first stays the source though
  // the new placement drops it.
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_THAT(Ids(plan->at({"d", "b"})), ElementsAre(0u, 1u));
  EXPECT_EQ(NewCopies(before, after), (ChunksByServer{{"d", {0u, 1u}}}));
}

TEST(SeedPlanTest, AChunkWithNoLiveCopyIsNamed) {
  absl::StatusOr<SeedPlan> plan =
      PlanSeeds(Job({{"a", "b"}}), Job({{"c", "d"}}), LostAre({"a", "b"}));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("chunk 0 has no live copy"));
}

TEST(SeedPlanTest, CopiesAtTheSourcesStepAndRoundAreNotTorn) {
  const v1::JobInfo job = Job({{"a", "b"}, {"b", "a"}});
  const std::map<std::string, std::vector<v1::ChunkStatus>> statuses = {
      {"a", {Row(0, 7, 3), Row(1, 7, 3)}},
      // A copy whose state was written (seeded) matches any round.
      {"b", {Row(0, 7, 0), Row(1, 7, 3)}}};
  const TornCopies torn = FindTornCopies(job, job, statuses, LostAre({}));
  EXPECT_THAT(torn.by_server, IsEmpty());
  EXPECT_THAT(torn.plan, IsEmpty());
}

TEST(SeedPlanTest, ACopyAtAnotherStepOrRoundIsSeededFromTheSource) {
  const v1::JobInfo job = Job({{"a", "b"}, {"a", "c"}, {"b", "c"}});
  const std::map<std::string, std::vector<v1::ChunkStatus>> statuses = {
      {"a", {Row(0, 8, 4), Row(1, 8, 4)}},
      {"b", {Row(0, 7, 3), Row(2, 8, 5)}},      // chunk 0 a step behind
      {"c", {Row(1, 8, 5), Row(2, 8, 4, 1)}}};  // other rounds
  const TornCopies torn = FindTornCopies(job, job, statuses, LostAre({}));
  EXPECT_THAT(torn.by_server.at("b"), ElementsAre(0u));
  EXPECT_THAT(torn.by_server.at("c"), ElementsAre(1u, 2u));
  EXPECT_THAT(Ids(torn.plan.at({"b", "a"})), ElementsAre(0u));
  EXPECT_THAT(Ids(torn.plan.at({"c", "a"})), ElementsAre(1u));
  EXPECT_THAT(Ids(torn.plan.at({"c", "b"})), ElementsAre(2u));
}

TEST(SeedPlanTest, OnlyCopiesTheMoveKeepsAreJudged) {
  // Chunk 0's copy on b leaves (drained): it is not seeded again; a lost
  // source hands the judgement to the next live copy.
  const v1::JobInfo before = Job({{"a", "b"}, {"a", "b", "c"}});
  const v1::JobInfo after = Job({{"a", "d"}, {"a", "b", "c"}});
  const std::map<std::string, std::vector<v1::ChunkStatus>> statuses = {
      {"b", {Row(0, 6, 2), Row(1, 7, 2)}}, {"c", {Row(1, 6, 2)}}};
  const TornCopies torn = FindTornCopies(before, after, statuses, LostAre({"a"}));
  EXPECT_THAT(torn.by_server, (std::map<std::string, std::vector<uint32_t>>{{"c", {1u}}}));
  EXPECT_THAT(Ids(torn.plan.at({"c", "b"})), ElementsAre(1u));
}

TEST(SeedPlanTest, CopiesWithoutARowAreNotJudged) {
  const v1::JobInfo job = Job({{"a", "b"}});
  EXPECT_THAT(FindTornCopies(job, job, {{"b", {Row(0, 3, 1)}}}, LostAre({})).by_server,
              IsEmpty());  // the source did not answer
  EXPECT_THAT(FindTornCopies(job, job, {{"a", {Row(0, 3, 1)}}}, LostAre({})).by_server,
              IsEmpty());  // the copy did not
}

}  // namespace
}  // namespace strata
