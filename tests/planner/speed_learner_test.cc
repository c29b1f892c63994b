// SpeedLearner (planner/speed_learner.h) on simulated timings: steady under
// jitter, a slow rank found within a few steps and given back its share when
// it recovers, silence and absurd times handled, and gamma fitted from the
// timings put back at speed 1 as it would be with no slow rank.
#include "planner/speed_learner.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/calibration.h"
#include "planner/splitmix64.h"

namespace knapformer {
namespace {

constexpr double kK = 2e-15;     // seconds per unit of work
constexpr double kGamma = 0.49;  // the job's true gamma

// A step of `world` ranks whose true speeds are `speeds`: random work per
// rank (a linear and an attention part in varied proportion), timed with a
// uniform jitter of +-`jitter`.
std::vector<WorkSample> TimedStep(const std::vector<double>& speeds, double jitter,
                                  SplitMix64& random) {
  std::vector<WorkSample> ranks(speeds.size());
  for (size_t r = 0; r < speeds.size(); ++r) {
    const double u1 = random.Uniform(), u2 = random.Uniform(), u3 = random.Uniform();
    ranks[r].linear = 1e13 * (0.5 + u1);
    ranks[r].attention = 2e13 * u2;
    const double noise = 1 + jitter * (2 * u3 - 1);
    ranks[r].seconds =
        kK * (ranks[r].linear + kGamma * ranks[r].attention) / speeds[r] * noise;
  }
  return ranks;
}

TEST(SpeedLearnerTest, JitterOfFivePercentMovesNoRanksShare) {
  SpeedLearner learner(8);
  SplitMix64 seed(1);
  for (int step = 0; step < 500; ++step) {
    learner.Observe(TimedStep(std::vector<double>(8, 1.0), 0.05, seed), kGamma);
    ASSERT_TRUE(learner.PlanningSpeeds().empty()) << "step " << step;
  }
  EXPECT_EQ(learner.steps(), 500);
}

TEST(SpeedLearnerTest, FindsASlowRankAndGivesItsShareBackWhenItRecovers) {
  SpeedLearner learner(8);
  std::vector<double> truth(8, 1.0);
  truth[5] = 0.6;
  SplitMix64 seed(2);
  int found = -1;
  for (int step = 0; step < 30; ++step) {
    learner.Observe(TimedStep(truth, 0.05, seed), kGamma);
    if (found < 0 && std::abs(learner.speeds()[5] / 0.6 - 1) < 0.1) found = step;
  }
  ASSERT_GE(found, 0);
  EXPECT_LE(found, 5) << "timed steps to within 10% of 0.6";
  EXPECT_NEAR(learner.speeds()[5], 0.6, 0.06);
  for (int32_t r = 0; r < 8; ++r) {
    if (r != 5) {
      EXPECT_EQ(learner.speeds()[r], 1.0) << r;
    }
  }
  // Recovered: back at exactly 1 (one speed, the FLOP-balanced plan) in at
  // most the documented 2 timed steps, and stays there.
  truth[5] = 1.0;
  int back = -1;
  for (int step = 0; step < 20; ++step) {
    learner.Observe(TimedStep(truth, 0.05, seed), kGamma);
    if (back < 0 && learner.PlanningSpeeds().empty()) back = step;
    if (back >= 0) {
      EXPECT_TRUE(learner.PlanningSpeeds().empty()) << step;
    }
  }
  EXPECT_GE(back, 0);
  EXPECT_LE(back, 2);
}

TEST(SpeedLearnerTest, ARankThatStopsReportingCountsAsOne) {
  SpeedLearnerOptions options;
  options.stale_steps = 4;
  SpeedLearner learner(4, options);
  const std::vector<double> truth = {1, 1, 0.5, 1};
  SplitMix64 seed(3);
  for (int step = 0; step < 10; ++step) learner.Observe(TimedStep(truth, 0, seed), kGamma);
  ASSERT_NEAR(learner.speeds()[2], 0.5, 0.03);
  for (int step = 0; step < 4; ++step) {
    std::vector<WorkSample> ranks = TimedStep(truth, 0, seed);
    ranks[2].seconds = 0;  // rank 2 sends nothing
    learner.Observe(ranks, kGamma);
    if (step < 3) {
      EXPECT_NEAR(learner.speeds()[2], 0.5, 0.03) << step;
    }
  }
  EXPECT_EQ(learner.speeds()[2], 1.0);
  EXPECT_TRUE(learner.PlanningSpeeds().empty());
}

TEST(SpeedLearnerTest, ClampsAbsurdTimesAndIgnoresRanksWithoutWork) {
  SpeedLearner learner(4);
  SplitMix64 seed(4);
  for (int step = 0; step < 20; ++step) {
    std::vector<WorkSample> ranks = TimedStep({1, 1, 1, 1}, 0, seed);
    ranks[0].seconds *= 1000;  // a rank that stalled
    ranks[3] = WorkSample{0, 0, 1.0};  // no work: nothing to learn from
    ranks[1].seconds = std::nan("");
    learner.Observe(ranks, kGamma);
  }
  const double floor = SpeedLearnerOptions().min_speed;
  EXPECT_NEAR(learner.estimates()[0], floor, 1e-5);
  EXPECT_NEAR(learner.speeds()[0], floor, floor * SpeedLearnerOptions().tolerance);
  EXPECT_EQ(learner.speeds()[3], 1.0);
  // One rank timed with work per step (rank 2): no median, no step learned
  // from; rank 0's clamp came from the steps rank 2 shared.
  SpeedLearner alone(2);
  alone.Observe({WorkSample{1, 0, 1}, WorkSample{0, 0, 0}}, kGamma);
  EXPECT_EQ(alone.steps(), 0);
}

TEST(SpeedLearnerTest, GammaFittedAtUnitSpeedIsUnbiasedByASlowRank) {
  std::vector<double> truth(8, 1.0);
  truth[3] = 0.6;
  SpeedLearner learner(8);
  SplitMix64 seed(5);
  std::vector<WorkSample> raw, corrected, healthy;
  SplitMix64 healthy_seed(5);
  for (int step = 0; step < 40; ++step) {
    const std::vector<WorkSample> ranks = TimedStep(truth, 0.02, seed);
    learner.Observe(ranks, kGamma);
    const std::vector<WorkSample> none = TimedStep(std::vector<double>(8, 1.0), 0.02,
                                                   healthy_seed);
    if (step < 10) continue;  // the speeds are learned first
    for (int32_t r = 0; r < 8; ++r) {
      raw.push_back(ranks[r]);
      corrected.push_back(learner.AtUnitSpeed(r, ranks[r]));
      healthy.push_back(none[r]);
    }
  }
  auto with_slow = FitCostModel(corrected);
  auto without = FitCostModel(healthy);
  auto biased = FitCostModel(raw);
  ASSERT_TRUE(with_slow.ok() && without.ok() && biased.ok());
  EXPECT_NEAR(with_slow->gamma / without->gamma, 1.0, 0.05);
  EXPECT_NEAR(without->gamma, kGamma, 0.05 * kGamma);
  // Uncorrected, the slow rank's times fit worse than the corrected ones.
  EXPECT_GT(biased->rmse_seconds, 2 * with_slow->rmse_seconds);
}

TEST(SpeedLearnerTest, LearnersThatSeeTheSameStepsAgreeBitForBit) {
  SpeedLearner a(16), b(16);
  std::vector<double> truth(16, 1.0);
  truth[0] = 0.7;
  truth[9] = 1.4;
  SplitMix64 seed(6);
  for (int step = 0; step < 25; ++step) {
    const std::vector<WorkSample> ranks = TimedStep(truth, 0.08, seed);
    a.Observe(ranks, kGamma);
    b.Observe(ranks, kGamma);
  }
  EXPECT_EQ(a.speeds(), b.speeds());
  EXPECT_EQ(a.estimates(), b.estimates());
  EXPECT_LT(a.speeds()[0], 0.8);
  EXPECT_GT(a.speeds()[9], 1.25);
}

}  // namespace
}  // namespace knapformer
