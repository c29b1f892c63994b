// Plans under attention masks: unchanged without them, priced by the pairs
// they attend with them, and better balanced than mask-blind plans by the
// GPUs' true work.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/attention_mask.h"
#include "planner/auto_layout.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/plan_from_chunks.h"
#include "planner/replica_packer.h"
#include "planner/replica_solve.h"
#include "planner/step_time.h"
#include "planner/validate.h"
#include "tests/planner/make_world.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::MakeWorld;
using ::testing::HasSubstr;

struct MaskedStep {
  RankLengths lengths;
  RankMasks masks;
};

// Every rank: a few long causal documents, some full images, a
// block-causal video or two, a windowed document: masks differ between
// sequences, as the scenarios do.
MaskedStep RandomStep(int32_t ranks, uint64_t seed) {
  std::mt19937_64 random(seed);
  MaskedStep step;
  step.lengths.resize(ranks);
  step.masks.resize(ranks);
  for (int32_t r = 0; r < ranks; ++r) {
    const int count = 1 + static_cast<int>(random() % 6);
    for (int i = 0; i < count; ++i) {
      const int64_t length = 256 + static_cast<int64_t>(random() % 16384);
      AttentionMask mask;
      switch (random() % 4) {
        case 0:
          mask = AttentionMask::Full();
          break;
        case 1:
          mask = AttentionMask::Causal();
          break;
        case 2:
          mask = AttentionMask::Window(1 + static_cast<int64_t>(random() % 2048));
          break;
        default: {
          std::vector<MaskSpan> spans;
          for (int64_t left = length; left > 0;) {
            const int64_t n = std::min<int64_t>(left, 64 + static_cast<int64_t>(random() % 4096));
            spans.push_back({n, random() % 3 == 0});
            left -= n;
          }
          mask = AttentionMask::Spans(std::move(spans));
        }
      }
      step.lengths[r].push_back(length);
      step.masks[r].push_back(std::move(mask));
    }
  }
  return step;
}

double TrueMaxOverMean(const Plan& plan) {
  return ComputeBalanceStats(plan.workload_after).max_over_mean;
}

TEST(MaskedBalancerTest, EveryWayInGivesThePlanItsMasks) {
  // The plan keeps the masks (each rank's slice hands them to its attention
  // kernel): copied from a checked input the caller keeps, moved from the
  // input the lengths overloads check themselves, for both balancers.
  const World world = MakeWorld("g1n2+g2n1+g4n1", 16);
  const CostModel cost = *CostModel::Create(2048, 0.49);
  const MaskedStep step = RandomStep(16, 3);
  const BalancerInput input = *BalancerInput::Check(16, step.lengths, step.masks, BalancerLimits());
  const AutoLayout layout = *AutoLayout::Parse("auto:max_bag=4");
  const CommPrices prices = *CommPrices::Create(Machine(), cost, 2 * 3072);
  auto from_lengths = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &step.masks);
  auto from_input = BalanceGreedy(world, cost, input, BalancerOptions());
  auto auto_lengths =
      BalanceAuto(layout, 16, cost, prices, step.lengths, BalancerOptions(), &step.masks);
  auto auto_input = BalanceAuto(layout, cost, prices, input, BalancerOptions());
  ASSERT_TRUE(from_lengths.ok() && from_input.ok() && auto_lengths.ok() && auto_input.ok());
  EXPECT_EQ(from_lengths->masks, step.masks);
  EXPECT_EQ(from_input->masks, step.masks);
  EXPECT_EQ(auto_lengths->plan.masks, step.masks);
  EXPECT_EQ(auto_input->plan.masks, step.masks);
  EXPECT_EQ(*input.masks(), step.masks);  // the caller's input keeps its own
  EXPECT_FALSE(from_lengths->Slice(0).attention_masks.empty());
  // Without masks the plan has none.
  auto plain = BalanceGreedy(world, cost, step.lengths);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->masks.empty());
}

TEST(MaskedBalancerTest, FullMasksGiveExactlyTheUnmaskedPlan) {
  const World world = MakeWorld("g1n2+g2n1+g4n1", 16);
  const CostModel cost = *CostModel::Create(2048, 0.49);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    MaskedStep step = RandomStep(16, seed);
    RankMasks full(16);
    for (int32_t r = 0; r < 16; ++r) full[r].assign(step.lengths[r].size(), AttentionMask::Full());
    auto plain = BalanceGreedy(world, cost, step.lengths);
    auto masked = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &full);
    auto none = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &step.masks);
    ASSERT_TRUE(plain.ok() && masked.ok() && none.ok());
    ASSERT_EQ(plain->chunks.size(), masked->chunks.size());
    for (size_t c = 0; c < plain->chunks.size(); ++c) {
      EXPECT_EQ(plain->chunks[c].dst_rank, masked->chunks[c].dst_rank);
      EXPECT_EQ(plain->chunks[c].length, masked->chunks[c].length);
    }
    EXPECT_EQ(plain->workload_after, masked->workload_after);
    EXPECT_EQ(plain->workload_before, masked->workload_before);
    // The step's real masks price it differently: the masks are used.
    EXPECT_NE(none->workload_before, plain->workload_before);
    RankMasks empty;
    auto empty_plan = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &empty);
    EXPECT_EQ(empty_plan->workload_after, plain->workload_after);
  }
}

TEST(MaskedBalancerTest, WorkloadsArePricedByTheAttendedPairs) {
  // One GPU each; d = 1, gamma = 1: attention is 4 * pairs, linear 24 * l.
  const World world = MakeWorld("g1n2", 2);
  const CostModel cost = *CostModel::Create(1, 1.0);
  const RankLengths lengths = {{100}, {60, 40}};
  const RankMasks masks = {{AttentionMask::Causal()},
                           {AttentionMask::Window(10), AttentionMask::Spans({{15, false},
                                                                             {25, true}})}};
  auto plan = BalanceGreedy(world, cost, lengths, BalancerOptions(), &masks);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(plan->workload_before[0], 24.0 * 100 + 4.0 * 5050);
  EXPECT_DOUBLE_EQ(plan->workload_before[1],
                   24.0 * 100 + 4.0 * (55 + 50 * 10) + 4.0 * (225 + 25 * 15 + 325));
  double total_after = 0;
  for (double w : plan->workload_after) total_after += w;
  EXPECT_DOUBLE_EQ(total_after, plan->workload_before[0] + plan->workload_before[1]);
}

TEST(MaskedBalancerTest, MaskedPlansAreValidDeterministicAndBeatMaskBlindOnes) {
  const CostModel cost = *CostModel::Create(1024, 0.49);
  double masked_sum = 0, blind_sum = 0;
  int masked_wins = 0, blind_wins = 0;
  for (const char* spec : {"g1n8", "g1n4+g2n2", "g1n2+g2n1+g4n1"}) {
    const World world = MakeWorld(spec, 32);
    for (uint64_t seed = 100; seed < 120; ++seed) {
      const MaskedStep step = RandomStep(32, seed);
      auto masked = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &step.masks);
      ASSERT_TRUE(masked.ok()) << masked.status();
      EXPECT_TRUE(ValidatePlan(*masked, world, step.lengths).ok());
      auto again = BalanceGreedy(world, cost, step.lengths, BalancerOptions(), &step.masks);
      EXPECT_EQ(again->workload_after, masked->workload_after);
      // The mask-blind plan, priced by what its GPUs really attend.
      auto blind = BalanceGreedy(world, cost, step.lengths);
      auto blind_true = PlanFromChunks(world, cost, step.lengths, blind->chunks, &step.masks);
      ASSERT_TRUE(blind_true.ok()) << blind_true.status();
      const double m = TrueMaxOverMean(*masked), b = TrueMaxOverMean(*blind_true);
      masked_sum += m;
      blind_sum += b;
      masked_wins += m < b;
      blind_wins += b < m;
      // Never under the bound, which is itself priced with the masks.
      EXPECT_GE(m, MaxOverMeanLowerBound(world, cost, step.lengths, &step.masks) * (1 - 1e-12));
    }
  }
  EXPECT_LT(masked_sum, blind_sum * 0.98) << masked_sum / 60 << " vs " << blind_sum / 60;
  EXPECT_GT(masked_wins, 3 * blind_wins);
}

TEST(MaskedBalancerTest, AutoLayoutAndPredictedTimeUseTheMasks) {
  const CostModel cost = *CostModel::Create(3072, 0.49);
  const AutoLayout layout = *AutoLayout::Parse("auto:max_bag=4");
  const CommPrices prices = *CommPrices::Create(Machine(), cost, 2 * 3072);
  const MaskedStep step = RandomStep(16, 5);
  auto masked = BalanceAuto(layout, 16, cost, prices, step.lengths, BalancerOptions(), &step.masks);
  auto blind = BalanceAuto(layout, 16, cost, prices, step.lengths);
  ASSERT_TRUE(masked.ok() && blind.ok());
  EXPECT_EQ(masked->predicted.time,
            PredictStep(masked->plan, masked->world, step.lengths, cost, prices, &step.masks).time);
  // Masks only take pairs away: the masked prediction of the same plan is lower.
  EXPECT_LT(PredictStep(blind->plan, blind->world, step.lengths, cost, prices, &step.masks).time,
            blind->predicted.time);
}

TEST(MaskedBalancerTest, MalformedMasksAreRefusedBeforeAnythingIsPlanned) {
  const World world = MakeWorld("g1n2", 2);
  const CostModel cost = *CostModel::Create(64, 0.49);
  const RankLengths lengths = {{10, 20}, {30}};
  const RankMasks partial = {{AttentionMask::Causal(), AttentionMask::Causal()}, {}};
  auto plan = BalanceGreedy(world, cost, lengths, BalancerOptions(), &partial);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("masks[1]: 0 masks for 1 sequences"));
  const RankMasks window = {{AttentionMask::Causal(), AttentionMask::Window(-1)},
                            {AttentionMask::Full()}};
  EXPECT_THAT(std::string(BalanceGreedy(world, cost, lengths, BalancerOptions(), &window)
                              .status()
                              .message()),
              HasSubstr("masks[0][1].window: must be at least 1, got -1"));
}

// The packer's order under masks is workload descending, then length
// descending, then id: the sort keys on the workload rounded to a float,
// then orders each run of one float, so near ties (workloads one float
// apart or less), equal workloads of different lengths (the uniform model
// prices every sequence alike) and equal sequences must all come out as a
// comparison sort puts them.
TEST(MaskedBalancerTest, SequencesAreOrderedByWorkloadThenLengthThenId) {
  MaskedStep step = RandomStep(64, 11);
  // Lengths next to each other past 2^24 tokens: workloads that differ in
  // the double but not in the float.
  for (int64_t length : {int64_t{1} << 30, (int64_t{1} << 30) + 1, (int64_t{1} << 30) + 2,
                         (int64_t{1} << 26) + 3, (int64_t{1} << 26) + 4}) {
    step.lengths[length % 64].push_back(length);
    step.masks[length % 64].push_back(AttentionMask::Causal());
  }
  // Equal sequences on several ranks (ties broken by id).
  for (int32_t r = 0; r < 64; r += 3) {
    step.lengths[r].push_back(4096);
    step.masks[r].push_back(AttentionMask::Causal());
  }
  const std::vector<int32_t> first = internal::FirstSequences(step.lengths);
  for (CostKind kind : {CostKind::kTransformer, CostKind::kUniform}) {
    const CostModel cost = *CostModel::Create(1024, 1.0, kind);
    const SortedSequences sorted =
        internal::SortReplicaSequences(cost, step.lengths, 0, 64, first, &step.masks);
    ASSERT_TRUE(sorted.masked);
    std::vector<int32_t> want(first.back());
    std::iota(want.begin(), want.end(), 0);
    std::vector<double> workload(first.back());
    std::vector<int64_t> length(first.back());
    for (int32_t r = 0; r < 64; ++r) {
      for (size_t i = 0; i < step.lengths[r].size(); ++i) {
        length[first[r] + i] = step.lengths[r][i];
        workload[first[r] + i] = cost.Workload(step.lengths[r][i], &step.masks[r][i]);
      }
    }
    std::sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
      if (workload[a] != workload[b]) return workload[a] > workload[b];
      if (length[a] != length[b]) return length[a] > length[b];
      return a < b;
    });
    EXPECT_EQ(sorted.table.id, want) << static_cast<int>(kind);
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(sorted.table.workload[k], workload[want[k]]) << k;
      EXPECT_EQ(sorted.table.length[k], length[want[k]]) << k;
    }
  }
}

}  // namespace
}  // namespace knapformer
