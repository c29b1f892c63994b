// The measured cost model's table fitted from whole steps (what the planner
// service sees): each rank's attention spread over the grid, and the table
// recovered from step times.
#include "planner/measured_fit.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kDModel = 64;

// A plan of 4 ranks (a one-GPU bag, two of them, and a two-GPU bag: shares
// of 1 and 1/2) over lengths in [lo, hi], spread evenly in their logarithm
// as mixed data is (many short sequences, a few long).
Plan RandomPlan(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const World world = *World::Create(*Topology::Parse("g1n2+g2n1"), 4);
  std::uniform_real_distribution<double> log_length(std::log(lo), std::log(hi));
  std::uniform_int_distribution<int> count(1, 6);
  RankLengths lengths(4);
  for (auto& rank : lengths) {
    for (int n = count(rng); n > 0; --n) {
      rank.push_back(std::clamp<int64_t>(std::llround(std::exp(log_length(rng))), lo, hi));
    }
  }
  return *BalanceGreedy(world, *CostModel::Create(kDModel, 1.0), lengths);
}

// Each rank's seconds under the true table: k per linear unit, and its share
// of each of its bag's sequences priced by `table`.
std::vector<double> TrueSeconds(const Plan& plan, const MeasuredAttention& table, double k) {
  const std::vector<WorkSample> work = RankWork(plan, kDModel);
  std::vector<double> seconds(plan.world_size);
  for (int r = 0; r < plan.world_size; ++r) seconds[r] = k * work[r].linear;
  for (const PlacedSequence& seq : plan.sequences) {
    if (seq.bag < 0) continue;
    const double l = static_cast<double>(seq.length);
    const int32_t gpus = plan.bag_gpus[seq.bag];
    for (int32_t p = 0; p < gpus; ++p) {
      seconds[plan.bag_first_rank[seq.bag] + p] += k * table.Work(l * l) / gpus;
    }
  }
  return seconds;
}

TEST(RankPairWeightsTest, EachRankHoldsItsShareOfEverySequenceAndItsPairs) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    const Plan plan = RandomPlan(rng, 1, 5000);
    const std::vector<PairWeights> weights = RankPairWeights(plan);
    const std::vector<WorkSample> work = RankWork(plan, kDModel);
    ASSERT_EQ(weights.size(), 4u);
    double sequences = 0;
    for (int r = 0; r < 4; ++r) {
      // Interpolation is linear in the pairs, so the points' pairs weighted
      // by the rank's weights are the pairs it attends.
      double pairs = 0;
      for (int j = 0; j < kPairGridPoints; ++j) {
        EXPECT_GE(weights[r][j], 0.0f);
        pairs += weights[r][j] * PairGridPoint(j);
        sequences += weights[r][j];
      }
      EXPECT_NEAR(pairs, work[r].attention / (4.0 * kDModel), 1e-5 * pairs) << "rank " << r;
    }
    EXPECT_NEAR(sequences, static_cast<double>(plan.sequences.size()), 1e-4);
  }
}

TEST(RankPairWeightsTest, ASequenceOnAGridPointWeighsOnThatPointAlone) {
  const World world = *World::Create(*Topology::Parse("g2n1"), 2);
  const Plan plan = *BalanceGreedy(world, *CostModel::Create(kDModel, 1.0), {{256}, {}});
  for (const PairWeights& rank : RankPairWeights(plan)) {
    for (int j = 0; j < kPairGridPoints; ++j) {
      EXPECT_EQ(rank[j], j == 8 ? 0.5f : 0.0f) << "point " << j;  // 256^2 = 4^8, half each
    }
  }
}

// A table far from the transformer model's straight line: a launch cost
// that dominates short sequences, then pairs at two rates.
MeasuredAttention TrueTable() {
  std::vector<double> pairs, work;
  for (int j = 3; j <= 13; ++j) {
    const double p = PairGridPoint(j);
    pairs.push_back(p);
    work.push_back(2e6 + (j < 9 ? 40.0 : 25.0) * 4 * kDModel * p + (j >= 9 ? 2e7 : 0.0));
  }
  return *MeasuredAttention::Create(pairs, work, "true");
}

std::vector<StepSample> Steps(int count, double k, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, noise);
  const MeasuredAttention table = TrueTable();
  std::vector<StepSample> steps;
  while (static_cast<int>(steps.size()) < count) {
    const Plan plan = RandomPlan(rng, 8, 8192);
    const std::vector<WorkSample> work = RankWork(plan, kDModel);
    const std::vector<PairWeights> weights = RankPairWeights(plan);
    const std::vector<double> seconds = TrueSeconds(plan, table, k);
    for (int r = 0; r < 4; ++r) {
      StepSample step{work[r], weights[r]};
      step.work.seconds = seconds[r] * (1 + jitter(rng));
      steps.push_back(step);
    }
  }
  return steps;
}

TEST(FitMeasuredAttentionFromStepsTest, RecoversATableOnTheGridFromExactStepTimes) {
  constexpr double kK = 1e-12;
  absl::StatusOr<MeasuredAttention> fitted =
      FitMeasuredAttentionFromSteps(Steps(400, kK, 0.0, 2), kK);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  const MeasuredAttention truth = TrueTable();
  // Lengths 8..8192 attend around grid points 3..13.
  EXPECT_EQ(fitted->pairs().front(), PairGridPoint(3));
  EXPECT_EQ(fitted->pairs().back(), PairGridPoint(13));
  for (double p : fitted->pairs()) {
    EXPECT_NEAR(fitted->Work(p), truth.Work(p), 1e-4 * truth.Work(p)) << "pairs " << p;
  }
}

TEST(FitMeasuredAttentionFromStepsTest, WithNoisyTimesItIsCloseAndNeverDecreases) {
  constexpr double kK = 1e-12;
  absl::StatusOr<MeasuredAttention> fitted =
      FitMeasuredAttentionFromSteps(Steps(2000, kK, 0.03, 3), kK);
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  const MeasuredAttention truth = TrueTable();
  // The short points carry little of any step's time, so they are known
  // less well; the points from 2^7 tokens up carry most of it.
  for (double p : fitted->pairs()) {
    if (p < PairGridPoint(7)) continue;
    EXPECT_NEAR(fitted->Work(p), truth.Work(p), 0.1 * truth.Work(p)) << "pairs " << p;
  }
  // MeasuredAttention::Create refuses a decreasing table, so a fit that
  // exists is nondecreasing; and the steps' times are explained.
  double worst = 0;
  for (const StepSample& step : Steps(200, kK, 0.0, 4)) {
    double predicted = kK * step.work.linear;
    for (int j = 0; j < kPairGridPoints; ++j) {
      predicted += kK * step.weights[j] * fitted->Work(PairGridPoint(j));
    }
    worst = std::max(worst, std::abs(predicted - step.work.seconds) / step.work.seconds);
  }
  EXPECT_LT(worst, 0.05);
}

// Steps whose only long sequences are 1200 tokens: 1200^2 pairs lie between
// grid points 4^10 and 4^11, and one length there fixes one mix of the two.
std::vector<StepSample> StepsWithOneLongLength(int count, double k) {
  std::mt19937_64 rng(7);
  const World world = *World::Create(*Topology::Parse("g1n2+g2n1"), 4);
  std::uniform_real_distribution<double> log_length(std::log(64), std::log(400));
  const MeasuredAttention table = TrueTable();
  std::vector<StepSample> steps;
  while (static_cast<int>(steps.size()) < count) {
    RankLengths lengths(4);
    for (auto& rank : lengths) {
      for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) {
        rank.push_back(std::llround(std::exp(log_length(rng))));
      }
      if (rng() % 2 == 0) rank.push_back(1200);
    }
    const Plan plan = *BalanceGreedy(world, *CostModel::Create(kDModel, 1.0), lengths);
    const std::vector<WorkSample> work = RankWork(plan, kDModel);
    const std::vector<PairWeights> weights = RankPairWeights(plan);
    const std::vector<double> seconds = TrueSeconds(plan, table, k);
    for (int r = 0; r < 4; ++r) {
      StepSample step{work[r], weights[r]};
      step.work.seconds = seconds[r];
      steps.push_back(step);
    }
  }
  return steps;
}

TEST(FitMeasuredAttentionFromStepsTest, APriorHoldsThePointsTheStepsCannotTellApart) {
  constexpr double kK = 1e-12;
  const std::vector<StepSample> steps = StepsWithOneLongLength(400, kK);
  const MeasuredAttention truth = TrueTable();
  // A prior of another shape (a straight line in the pairs, through the
  // truth at 4^12) and a quarter of the level: the steps overrule it where
  // they can.
  const double per_pair = truth.Work(PairGridPoint(12)) / PairGridPoint(12) / 4;
  const MeasuredAttention prior =
      *MeasuredAttention::Create({1.0, 1e12}, {per_pair, per_pair * 1e12}, "prior");
  for (const MeasuredAttention* given : {static_cast<const MeasuredAttention*>(nullptr), &prior}) {
    absl::StatusOr<MeasuredAttention> fitted = FitMeasuredAttentionFromSteps(steps, kK, given);
    ASSERT_TRUE(fitted.ok()) << fitted.status();
    // What the steps measured: the 1200-token sequence, and lengths 64..400.
    for (double l : {1200.0, 64.0, 100.0, 200.0, 400.0}) {
      EXPECT_NEAR(fitted->Work(l * l), truth.Work(l * l), 1e-3 * truth.Work(l * l))
          << "length " << l << (given ? " with" : " without") << " the prior";
    }
  }
  // With the prior the point above 1200 tokens (2048) grows with the
  // pairs as the prior does, instead of staying wherever the mix allows.
  const MeasuredAttention fitted = *FitMeasuredAttentionFromSteps(steps, kK, &prior);
  const double above = PairGridPoint(11), below = PairGridPoint(10);
  EXPECT_GT(fitted.Work(above), 2.5 * fitted.Work(below));
  EXPECT_NEAR(fitted.Work(above), truth.Work(above), 0.5 * truth.Work(above));
}

TEST(FitMeasuredAttentionFromStepsTest, TooFewStepsOrABadScaleAreRefusedByName) {
  constexpr double kK = 1e-12;
  const std::vector<StepSample> steps = Steps(8, kK, 0.0, 5);
  absl::StatusOr<MeasuredAttention> fitted = FitMeasuredAttentionFromSteps(steps, kK);
  EXPECT_EQ(fitted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fitted.status().message(), HasSubstr("8 timings (one per rank and step) for a table of"));
  EXPECT_THAT(FitMeasuredAttentionFromSteps(steps, 0).status().message(),
              HasSubstr("k: must be a finite number > 0"));
  EXPECT_THAT(FitMeasuredAttentionFromSteps({StepSample{}}, kK).status().message(),
              HasSubstr("none attends any pairs"));
  std::vector<StepSample> bad = Steps(40, kK, 0.0, 6);
  bad[7].work.seconds = -1;
  EXPECT_THAT(FitMeasuredAttentionFromSteps(bad, kK).status().message(),
              HasSubstr("steps[7]: values must be finite and >= 0"));
}

}  // namespace
}  // namespace knapformer
