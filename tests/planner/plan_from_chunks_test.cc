// A plan rebuilt from its chunk table (what a group's ranks do with the
// table their leader got from the service) is the solver's plan, field for
// field, on thousands of random worlds; a damaged table is refused, never
// turned into a plan that loses or duplicates a token.
#include "planner/plan_from_chunks.h"

#include <limits>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

struct Problem {
  World world;
  RankLengths lengths;
};

Problem RandomProblem(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  static const int kSizes[] = {1, 2, 4, 8};
  std::string spec;
  const int terms = static_cast<int>(pick(1, 3));
  for (int t = 0; t < terms; ++t) {
    spec += absl::StrCat(t ? "+" : "", "g", kSizes[pick(0, 3)], "n", pick(1, 3));
  }
  auto topology = Topology::Parse(spec);
  auto world = World::Create(*topology, topology->group_size() * pick(1, 3));
  RankLengths lengths(world->world_size());
  for (auto& rank : lengths) {
    const int n = static_cast<int>(pick(0, 6));
    for (int i = 0; i < n; ++i) rank.push_back(pick(0, 9) == 0 ? pick(0, 5) : pick(1, 30000));
  }
  return Problem{*std::move(world), std::move(lengths)};
}

void ExpectSamePlan(const Plan& got, const Plan& want) {
  ASSERT_EQ(got.sequences.size(), want.sequences.size());
  for (size_t s = 0; s < got.sequences.size(); ++s) {
    EXPECT_EQ(got.sequences[s].bag, want.sequences[s].bag) << "sequence " << s;
    EXPECT_EQ(got.sequences[s].first_chunk, want.sequences[s].first_chunk) << "sequence " << s;
    EXPECT_EQ(got.sequences[s].num_chunks, want.sequences[s].num_chunks) << "sequence " << s;
  }
  EXPECT_EQ(got.rank_first_sequence, want.rank_first_sequence);
  EXPECT_EQ(got.bag_sequences, want.bag_sequences);
  EXPECT_EQ(got.bag_begin, want.bag_begin);
  EXPECT_EQ(got.bag_first_rank, want.bag_first_rank);
  EXPECT_EQ(got.bag_gpus, want.bag_gpus);
  EXPECT_EQ(got.topology, want.topology);
  ASSERT_EQ(got.workload_after.size(), want.workload_after.size());
  for (size_t r = 0; r < got.workload_after.size(); ++r) {
    // Both price a GPU's tokens once, then add its share of its bag's
    // attention in the same order: equal to the bit.
    EXPECT_EQ(got.workload_after[r], want.workload_after[r]) << "rank " << r;
    EXPECT_DOUBLE_EQ(got.workload_before[r], want.workload_before[r]) << "rank " << r;
  }
}

TEST(PlanFromChunks, RebuildsTheSolversPlanOnRandomWorlds) {
  std::mt19937_64 rng(20261123);
  const CostModel cost = *CostModel::Create(128, 0.7);
  for (int trial = 0; trial < 2000; ++trial) {
    Problem problem = RandomProblem(rng);
    BalancerOptions options;
    options.locality = trial % 2 == 0;
    auto plan = BalanceGreedy(problem.world, cost, problem.lengths, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto rebuilt = PlanFromChunks(problem.world, cost, problem.lengths, plan->chunks);
    ASSERT_TRUE(rebuilt.ok()) << "trial " << trial << ": " << rebuilt.status();
    ExpectSamePlan(*rebuilt, *plan);
    if (HasFailure()) FAIL() << "trial " << trial << ", topology " << plan->topology;
  }
}

class DamagedTable : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = *World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 8);
    lengths_ = {{900, 40}, {30}, {}, {5000, 7}, {64}, {3}, {1200}, {2}};
    auto plan = BalanceGreedy(*world_, cost_, lengths_);
    ASSERT_TRUE(plan.ok());
    chunks_ = plan->chunks;
    ASSERT_GT(chunks_.size(), 4u);
  }
  absl::Status Rebuild() { return PlanFromChunks(*world_, cost_, lengths_, chunks_).status(); }

  std::optional<World> world_;
  CostModel cost_ = *CostModel::Create(64, 1.0);
  RankLengths lengths_;
  std::vector<Chunk> chunks_;
};

TEST_F(DamagedTable, ADroppedChunkIsRefused) {
  chunks_.pop_back();
  EXPECT_EQ(Rebuild().code(), absl::StatusCode::kInternal);
}

TEST_F(DamagedTable, ADuplicatedChunkIsRefused) {
  chunks_.insert(chunks_.begin() + 1, chunks_[1]);
  EXPECT_EQ(Rebuild().code(), absl::StatusCode::kInternal);
}

TEST_F(DamagedTable, AChunkOfASequenceThatDoesNotExistIsRefusedByName) {
  chunks_.back().seq_index = 9;
  EXPECT_THAT(Rebuild().message(), HasSubstr("names sequence 9 of rank"));
}

TEST_F(DamagedTable, ADestinationOutsideTheWorldIsRefused) {
  chunks_[0].dst_rank = 8;
  EXPECT_THAT(Rebuild().message(), HasSubstr("goes to rank 8, outside [0, 8)"));
}

TEST_F(DamagedTable, ChunksOutOfOrderAreRefused) {
  std::swap(chunks_.front(), chunks_.back());
  EXPECT_EQ(Rebuild().code(), absl::StatusCode::kInternal);
}

TEST_F(DamagedTable, ATokenCountThatDoesNotCoverTheSequenceIsRefused) {
  chunks_[0].length += 1;
  EXPECT_EQ(Rebuild().code(), absl::StatusCode::kInternal);
}

TEST_F(DamagedTable, AChunkLongerThanItsSequenceIsRefusedByName) {
  // Lengths that would overflow the tokens summed per GPU are refused first.
  chunks_[0].length = std::numeric_limits<int64_t>::max();
  chunks_[1].length = std::numeric_limits<int64_t>::max();
  EXPECT_THAT(Rebuild().message(), HasSubstr("chunk 0 has length 9223372036854775807, outside"));
  chunks_[0].length = -1;
  EXPECT_THAT(Rebuild().message(), HasSubstr("chunk 0 has length -1, outside"));
}

TEST_F(DamagedTable, LengthsForAnotherWorldSizeAreInvalid) {
  lengths_.pop_back();
  EXPECT_EQ(Rebuild().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace knapformer
