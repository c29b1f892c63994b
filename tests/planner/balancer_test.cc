#include "planner/balancer.h"

#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balance_stats.h"
#include "planner/validate.h"
#include "tests/planner/make_world.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::MakeWorld;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using ::testing::HasSubstr;

// d = 1, gamma = 0: workload = 24 * tokens, so hand-worked plans stay readable.
CostModel LinearCost() { return *CostModel::Create(1, 0.0); }

auto AsTuple(const Chunk& c) {
  return std::make_tuple(c.src_rank, c.seq_index, c.offset, c.length, c.dst_rank);
}
std::vector<std::tuple<int32_t, int32_t, int64_t, int64_t, int32_t>> Tuples(const Plan& plan) {
  std::vector<std::tuple<int32_t, int32_t, int64_t, int64_t, int32_t>> out;
  for (const Chunk& c : plan.chunks) out.push_back(AsTuple(c));
  return out;
}

Plan PlanOrDie(const World& world, const CostModel& cost, const RankLengths& lengths,
               const BalancerOptions& options = BalancerOptions()) {
  auto plan = BalanceGreedy(world, cost, lengths, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ValidatePlan(*plan, world, lengths).ok()) << ValidatePlan(*plan, world, lengths);
  EXPECT_TRUE(ValidateSlices(*plan, lengths).ok()) << ValidateSlices(*plan, lengths);
  return *plan;
}

TEST(BalancerTest, HandWorkedTwoGpuPlan) {
  const World world = MakeWorld("g1n2", 2);
  // Sorted 30, 20, 10: 30 -> bag 0 (tie, lowest id); 20 -> bag 1; 10 -> bag 1.
  const Plan plan = PlanOrDie(world, LinearCost(), {{30, 20, 10}, {}});
  using T = std::tuple<int32_t, int32_t, int64_t, int64_t, int32_t>;
  EXPECT_THAT(Tuples(plan), ElementsAre(T{0, 0, 0, 30, 0}, T{0, 1, 0, 20, 1}, T{0, 2, 0, 10, 1}));
  EXPECT_THAT(plan.workload_after, ElementsAre(24.0 * 30, 24.0 * 30));
  EXPECT_THAT(plan.workload_before, ElementsAre(24.0 * 60, 0.0));
  EXPECT_EQ(plan.MovedTokens(), 30);
  EXPECT_EQ(plan.TotalTokens(), 60);

  const RankPlan rank0 = plan.Slice(0);
  ASSERT_EQ(rank0.route.sends.size(), 3u);
  EXPECT_EQ(rank0.route.sends[0].peer, 0);
  EXPECT_EQ(rank0.route.sends[1].peer, 1);
  EXPECT_EQ(rank0.route.sends[1].seq_index, 1);
  EXPECT_EQ(rank0.route.sends[2].seq_index, 2);
  const RankPlan rank1 = plan.Slice(1);
  EXPECT_TRUE(rank1.route.sends.empty());
  EXPECT_THAT(rank1.compute_chunk_lengths, ElementsAre(20, 10));
  const Route back = ReverseRoute(rank1.route);
  ASSERT_EQ(back.sends.size(), 2u);
  EXPECT_EQ(back.sends[0].peer, 0);
  EXPECT_TRUE(back.recvs.empty());
  EXPECT_EQ(rank1.ulysses.gpus, 1);
  EXPECT_TRUE(rank1.ulysses.sequences.empty());
}

// Locality, worked by hand with a linear cost (workload = 24 * length).
TEST(BalancerTest, LocalityKeepsTokensHomeAtTheSameMaximum) {
  const World world = MakeWorld("g1n2", 2);
  BalancerOptions greedy;
  greedy.locality = false;
  // Already balanced (60 | 60). The greedy deals 30 (rank 0) -> GPU 0,
  // 30 (rank 1) -> GPU 1, 30 (rank 1) -> GPU 0, then rank 0's 10s -> GPU 1:
  // 60 tokens move. Locality leaves everything where it is.
  const RankLengths even = {{30, 10, 10, 10}, {30, 30}};
  EXPECT_EQ(PlanOrDie(world, LinearCost(), even, greedy).MovedTokens(), 60);
  const Plan kept = PlanOrDie(world, LinearCost(), even);
  EXPECT_EQ(kept.MovedTokens(), 0);
  EXPECT_THAT(kept.workload_after, ElementsAre(24.0 * 60, 24.0 * 60));

  // 80 | 20; the best maximum is 60. The greedy: 40 -> 0, 20 -> 1, 20 -> 1,
  // rank 1's 20 -> 0 (moving 60). Home-first under 60: rank 0 keeps 40 + 20
  // and sends one 20; rank 1 keeps its own.
  const RankLengths heavy = {{40, 20, 20}, {20}};
  EXPECT_EQ(PlanOrDie(world, LinearCost(), heavy, greedy).MovedTokens(), 60);
  const Plan one = PlanOrDie(world, LinearCost(), heavy);
  EXPECT_EQ(one.MovedTokens(), 20);
  EXPECT_THAT(one.workload_after, ElementsAre(24.0 * 60, 24.0 * 40));
}

// Uniform: every sequence costs the same, whatever its length (a padded text
// encoder), so each GPU gets the same number of sequences.
TEST(BalancerTest, UniformCostBalancesSequenceCounts) {
  const World world = MakeWorld("g1n2", 2);
  const CostModel uniform = *CostModel::Create(1, 0.0, CostKind::kUniform);
  const Plan plan = PlanOrDie(world, uniform, {{1, 1000, 5, 7, 300, 2}, {}});
  std::vector<int> count(2, 0);
  for (const PlacedSequence& seq : plan.sequences) ++count[seq.bag];
  EXPECT_THAT(count, ElementsAre(3, 3));
  EXPECT_THAT(plan.workload_after, ElementsAre(3.0, 3.0));
}

// Linear: tokens are the cost.
TEST(BalancerTest, LinearCostBalancesTokens) {
  const World world = MakeWorld("g1n2", 2);
  const CostModel linear = *CostModel::Create(1, 0.0, CostKind::kLinear);
  const Plan plan = PlanOrDie(world, linear, {{600, 200, 200, 100, 100}, {}});
  EXPECT_THAT(plan.workload_after, UnorderedElementsAre(600.0, 600.0));
}

TEST(BalancerTest, TheTokenCapIsHardAndAnImpossibleOneIsAnError) {
  const World world = MakeWorld("g1n2", 2);
  BalancerOptions options;
  // 300 tokens in sequences of 100 on 2 GPUs: 200 per GPU is possible.
  options.max_tokens_per_gpu = 200;
  const Plan plan = PlanOrDie(world, LinearCost(), {{100, 100, 100}, {}}, options);
  EXPECT_THAT(plan.TokensPerRank(), UnorderedElementsAre(200, 100));
  // 150 per GPU is not.
  options.max_tokens_per_gpu = 150;
  auto refused = BalanceGreedy(world, LinearCost(), {{100, 100, 100}, {}}, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "max_tokens_per_gpu: sequence 2 of rank 0 (100 tokens) fits in no bag under the cap "
            "of 150 tokens per GPU (its replica holds 300 tokens in 300 tokens of capacity)");
}

// The refusal names the sequence by its own rank and index, in any replica:
// here the second, after two empty ranks, and past an empty sequence (which
// takes no bag); the replica's tokens count its short sequence too.
TEST(BalancerTest, TheCapErrorNamesTheSequenceInItsRankAndReplica) {
  const World world = MakeWorld("g1n2", 4);
  BalancerOptions options;
  options.max_tokens_per_gpu = 150;
  auto refused = BalanceGreedy(world, LinearCost(), {{}, {}, {5}, {0, 100, 100, 100}}, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "max_tokens_per_gpu: sequence 3 of rank 3 (100 tokens) fits in no bag under the cap "
            "of 150 tokens per GPU (its replica holds 305 tokens in 300 tokens of capacity)");
}

// A cap of INT64_MAX tokens per GPU is no cap: the bag capacities saturate
// instead of overflowing (which refused every bag).
TEST(BalancerTest, TheLargestTokenCapIsNoCap) {
  const World world = MakeWorld("g1n2+g2n1+g4n1", 8);
  const RankLengths lengths = {{4096, 256}, {1024}, {}, {16384, 300, 300}, {512}, {64}, {0},
                               {2048}};
  BalancerOptions capped;
  capped.max_tokens_per_gpu = INT64_MAX;
  const Plan with_cap = PlanOrDie(world, LinearCost(), lengths, capped);
  const Plan without = PlanOrDie(world, LinearCost(), lengths);
  EXPECT_EQ(Tuples(with_cap), Tuples(without));
}

// In a multi-GPU bag the source rank keeps its own chunk.
TEST(BalancerTest, LocalityKeepsTheSourcesChunkInItsOwnBag) {
  const World world = MakeWorld("g2n2", 4);
  // Bag 0 = ranks 0-1, bag 1 = ranks 2-3; each bag's own sequences balance.
  const Plan plan = PlanOrDie(world, LinearCost(), {{40}, {40}, {40}, {40}});
  // Every sequence stays in its bag: half of it (its chunk on the other GPU) moves.
  EXPECT_EQ(plan.MovedTokens(), 4 * 20);
  for (const PlacedSequence& seq : plan.sequences) {
    EXPECT_EQ(seq.bag, seq.src_rank / 2) << "sequence of rank " << seq.src_rank;
  }
}

TEST(BalancerTest, ChunksRotateTheRemainderAndFeedUlysses) {
  const World world = MakeWorld("g4n1", 4);
  // (0,0) l=10 -> [3,3,2,2]; (0,1) l=7 starts the extra tokens at position 2
  // -> [2,1,2,2]; (1,0) l=2 is shorter than the bag -> [0,1,1,0].
  const Plan plan = PlanOrDie(world, LinearCost(), {{10, 7}, {2}, {}, {}});
  using T = std::tuple<int32_t, int32_t, int64_t, int64_t, int32_t>;
  EXPECT_THAT(Tuples(plan),
              ElementsAre(T{0, 0, 0, 3, 0}, T{0, 0, 3, 3, 1}, T{0, 0, 6, 2, 2}, T{0, 0, 8, 2, 3},
                          T{0, 1, 0, 2, 0}, T{0, 1, 2, 1, 1}, T{0, 1, 3, 2, 2}, T{0, 1, 5, 2, 3},
                          T{1, 0, 0, 1, 1}, T{1, 0, 1, 1, 2}));
  // Tokens per GPU end within one of each other.
  EXPECT_THAT(plan.workload_after, ElementsAre(24.0 * 5, 24.0 * 5, 24.0 * 5, 24.0 * 4));

  const RankPlan rank2 = plan.Slice(2);
  EXPECT_EQ(rank2.ulysses.first_rank, 0);
  EXPECT_EQ(rank2.ulysses.gpus, 4);
  EXPECT_EQ(rank2.ulysses.position, 2);
  ASSERT_EQ(rank2.ulysses.sequences.size(), 3u);
  EXPECT_THAT(rank2.ulysses.sequences[0].chunk_lengths, ElementsAre(3, 3, 2, 2));
  EXPECT_THAT(rank2.ulysses.sequences[1].chunk_lengths, ElementsAre(2, 1, 2, 2));
  EXPECT_THAT(rank2.ulysses.sequences[2].chunk_lengths, ElementsAre(0, 1, 1, 0));
  EXPECT_EQ(rank2.ulysses.sequences[2].src_rank, 1);
  ASSERT_EQ(rank2.route.recvs.size(), 3u);
  EXPECT_EQ(rank2.route.recvs[2].peer, 1);
  EXPECT_EQ(rank2.route.recvs[2].offset, 1);
  EXPECT_THAT(rank2.compute_chunk_lengths, ElementsAre(2, 2, 1));
  // Rank 3 holds nothing of (1,0): its receives skip it.
  EXPECT_THAT(plan.Slice(3).compute_chunk_lengths, ElementsAre(2, 2));
}

TEST(BalancerTest, AttentionIsSharedByEveryGpuOfTheBag) {
  const World world = MakeWorld("g2n1", 2);
  auto cost = *CostModel::Create(8, 1.0);
  const Plan plan = PlanOrDie(world, cost, {{5}, {}});
  // Position 0 gets 3 tokens, position 1 gets 2; attention splits in halves.
  EXPECT_DOUBLE_EQ(plan.workload_after[0], cost.Linear(3) + cost.Attention(5) / 2);
  EXPECT_DOUBLE_EQ(plan.workload_after[1], cost.Linear(2) + cost.Attention(5) / 2);
}

TEST(BalancerTest, RefinementBeatsThePapersGreedyWhereLptFails) {
  const World world = MakeWorld("g1n2", 2);
  const RankLengths lengths = {{3, 3, 2, 2, 2}, {}};
  BalancerOptions paper;
  paper.refine_rounds = 0;
  // LPT: {3,2,2} vs {3,2} -> 7 : 5.
  const Plan greedy = PlanOrDie(world, LinearCost(), lengths, paper);
  EXPECT_THAT(greedy.workload_after, ElementsAre(24.0 * 7, 24.0 * 5));
  // One swap (a 3 for a 2) levels it at 6 : 6.
  const Plan refined = PlanOrDie(world, LinearCost(), lengths);
  EXPECT_THAT(refined.workload_after, ElementsAre(24.0 * 6, 24.0 * 6));
}

TEST(BalancerTest, NeverWorseThanLeavingTheDataWhereItIs) {
  const World world = MakeWorld("g1n2", 2);
  // Already optimal as it came; the paper's greedy alone would give 7 : 5.
  const RankLengths lengths = {{3, 3}, {2, 2, 2}};
  BalancerOptions paper;
  paper.refine_rounds = 0;
  const Plan plan = PlanOrDie(world, LinearCost(), lengths, paper);
  EXPECT_EQ(plan.workload_after, plan.workload_before);
  EXPECT_EQ(plan.MovedTokens(), 0);
}

// The balanced plan's maximum (10004: refinement gets stuck) is just under
// leaving everything home (10005), so the guard keeps it; the locality
// plan may be up to the slack over the balanced maximum, but never over
// the data as it came. (A home-first packing here ends at 10009, within the
// slack of 10004 and moving far fewer tokens: it must not be taken; here
// the repair finds nothing under 10005 and the balanced plan stays.)
// Found by review with a model of the packing.
TEST(BalancerTest, LocalityIsNeverWorseThanLeavingTheDataWhereItIs) {
  const World world = MakeWorld("g1n4", 4);
  const RankLengths lengths = {
      {10002}, {7985, 207, 352, 1452}, {9995}, {555, 1250, 755, 7445}};
  BalancerOptions balanced;
  balanced.locality = false;
  const Plan reference = PlanOrDie(world, LinearCost(), lengths, balanced);
  const BalanceStats before = ComputeBalanceStats(reference.workload_before);
  ASSERT_DOUBLE_EQ(before.max, 24.0 * 10005);
  ASSERT_DOUBLE_EQ(ComputeBalanceStats(reference.workload_after).max, 24.0 * 10004);

  const Plan plan = PlanOrDie(world, LinearCost(), lengths);
  EXPECT_LE(ComputeBalanceStats(plan.workload_after).max, before.max);
  EXPECT_LE(plan.MovedTokens(), reference.MovedTokens());
}

TEST(BalancerTest, EmptyWorldsAndEmptySequencesGiveEmptyValidPlans) {
  const World world = MakeWorld("g1n2+g2n1+g4n1", 8);
  const RankLengths lengths = {{}, {0, 0}, {}, {}, {}, {}, {}, {0}};
  const Plan plan = PlanOrDie(world, LinearCost(), lengths);
  EXPECT_TRUE(plan.chunks.empty());
  ASSERT_EQ(plan.sequences.size(), 3u);
  for (const PlacedSequence& seq : plan.sequences) {
    EXPECT_EQ(seq.bag, -1);
    EXPECT_EQ(seq.num_chunks, 0);
  }
  const BalanceStats stats = ComputeBalanceStats(plan.workload_after);
  EXPECT_EQ(stats.max, 0.0);
  EXPECT_EQ(stats.wir, 1.0);
}

TEST(BalancerTest, ZeroLengthSequencesKeepTheirIndexButGetNoChunk) {
  const World world = MakeWorld("g1n2", 2);
  const Plan plan = PlanOrDie(world, LinearCost(), {{0, 7, 0}, {5}});
  EXPECT_EQ(plan.sequences[0].num_chunks, 0);
  EXPECT_EQ(plan.sequences[1].num_chunks, 1);
  EXPECT_EQ(plan.chunks[0].seq_index, 1);
  EXPECT_EQ(plan.sequences[2].num_chunks, 0);
}

TEST(BalancerTest, FewerSequencesThanGpusLeavesSomeIdleButValid) {
  const World world = MakeWorld("g1n8", 8);
  const Plan plan = PlanOrDie(world, LinearCost(), {{100}, {}, {}, {50}, {}, {}, {}, {}});
  EXPECT_EQ(plan.chunks.size(), 2u);
  const BalanceStats stats = ComputeBalanceStats(plan.workload_after);
  EXPECT_DOUBLE_EQ(stats.max, 24.0 * 100);
  EXPECT_TRUE(std::isinf(stats.wir));
}

TEST(BalancerTest, AGiantSequenceGoesToTheLargestBag) {
  const World world = MakeWorld("g1n4+g4n1", 8);
  RankLengths lengths(8, std::vector<int64_t>{10});
  lengths[0].push_back(1000000);
  const Plan plan = PlanOrDie(world, *CostModel::Create(3072, 0.49), lengths);
  const PlacedSequence& giant = plan.sequences[1];
  EXPECT_EQ(giant.length, 1000000);
  EXPECT_EQ(plan.bag_gpus[giant.bag], 4);
  EXPECT_EQ(giant.num_chunks, 4);
  EXPECT_GE(ComputeBalanceStats(plan.workload_after).max_over_mean,
            MaxOverMeanLowerBound(world, *CostModel::Create(3072, 0.49), lengths) * (1 - 1e-12));
}

TEST(BalancerTest, ShortSequencesPreferBagsTheyCanFill) {
  const World world = MakeWorld("g1n1+g8n1", 9);
  RankLengths lengths(9);
  lengths[0] = {3, 3, 3};  // an 8-GPU bag would leave 5 of its GPUs without tokens
  const Plan plan = PlanOrDie(world, LinearCost(), lengths);
  for (const PlacedSequence& seq : plan.sequences) {
    EXPECT_EQ(plan.bag_gpus[seq.bag], 1) << "a 3-token sequence went to the 8-GPU bag";
  }
}

TEST(BalancerTest, ReplicasBalanceIndependently) {
  const World world = MakeWorld("g1n2", 4);
  const Plan plan = PlanOrDie(world, LinearCost(), {{10, 10}, {}, {4}, {4, 4, 4}});
  for (const Chunk& chunk : plan.chunks) {
    EXPECT_EQ(chunk.src_rank / 2, chunk.dst_rank / 2);
  }
  EXPECT_THAT(plan.workload_after, ElementsAre(24.0 * 10, 24.0 * 10, 24.0 * 8, 24.0 * 8));
}

TEST(BalancerTest, IsDeterministic) {
  const World world = MakeWorld("g1n2+g2n1+g4n1", 16);
  RankLengths lengths(16);
  for (int r = 0; r < 16; ++r) {
    for (int i = 0; i < r % 5; ++i) lengths[r].push_back(100 + (r * 37 + i * 11) % 50);
  }
  const Plan a = PlanOrDie(world, *CostModel::Create(3072, 0.49), lengths);
  const Plan b = PlanOrDie(world, *CostModel::Create(3072, 0.49), lengths);
  EXPECT_EQ(Tuples(a), Tuples(b));
  EXPECT_EQ(a.workload_after, b.workload_after);
}

TEST(BalancerTest, RejectsInputThatDoesNotMatchTheWorld) {
  const World world = MakeWorld("g1n2", 2);
  auto plan = BalanceGreedy(world, LinearCost(), {{1}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("ranks: got sequence lengths for 1 ranks, world_size is 2"));
}

TEST(BalancerTest, RejectsLengthsOutOfRangeNamingThem) {
  const World world = MakeWorld("g1n2", 2);
  auto negative = BalanceGreedy(world, LinearCost(), {{1}, {2, -3}});
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(std::string(negative.status().message()),
              HasSubstr("ranks[1][1]: sequence length -3 is outside [0, 2147483648]"));
  auto huge = BalanceGreedy(world, LinearCost(), {{CostModel::kMaxLength + 1}, {}});
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("ranks[0][0]"));
  EXPECT_TRUE(BalanceGreedy(world, LinearCost(), {{CostModel::kMaxLength}, {}}).ok());
}

TEST(BalancerTest, EnforcesItsLimits) {
  const World world = MakeWorld("g4n1", 4);
  BalancerOptions options;
  options.limits.max_sequences = 3;
  auto too_many = BalanceGreedy(world, LinearCost(), {{1, 1}, {1, 1}, {}, {}}, options);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("more than 3 sequences"));
  options = BalancerOptions();
  options.limits.max_chunks = 7;
  auto too_big = BalanceGreedy(world, LinearCost(), {{100, 100}, {}, {}, {}}, options);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.status().message()),
              HasSubstr("8 chunks exceed the limit of 7"));
}

}  // namespace
}  // namespace knapformer
