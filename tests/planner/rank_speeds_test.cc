// Speed-aware planning (planner/rank_speeds.h): the checks and the parser,
// plans exactly the FLOP-balanced ones under one speed, a slow rank given
// its share of time, bags at their slowest GPU's pace, the speed-aware
// bound, auto and the predicted step, and validity under caps and masks.
#include "planner/rank_speeds.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/auto_layout.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/data_stream.h"
#include "planner/machine.h"
#include "planner/masked_stream.h"
#include "planner/step_time.h"
#include "planner/validate.h"
#include "tests/planner/make_world.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::MakeWorld;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

CostModel Flux() { return *CostModel::Create(3072, 0.49); }

// The paper's joint image+video stream on `world` ranks, step `step`.
RankLengths JointBatch(int64_t world, int64_t step) {
  auto codes = ParseDataCodes(
      "g8b4i256f1s0,g2b5i512f1s0,g2b5i1024f1s0,g4b1i2048f1s0,g1b10i256f4s0,g3b1i512f4s0,"
      "g8b2i256f85s1,g4b1i512f85s1");
  EXPECT_TRUE(codes.ok()) << codes.status();
  auto stream = DataStream::Create(*codes, world, 7);
  EXPECT_TRUE(stream.ok()) << stream.status();
  return stream->Batch(step);
}

// Many short sequences per rank: what any speed can be balanced on.
RankLengths LowRes(int64_t world, int64_t step) {
  auto stream = DataStream::Create(*ParseDataCodes("g1b32i256f1s0"), world, 3);
  return stream->Batch(step);
}

Plan PlanOrDie(const World& world, const CostModel& cost, const RankLengths& lengths,
               const BalancerOptions& options, const RankMasks* masks = nullptr) {
  auto plan = BalanceGreedy(world, cost, lengths, options, masks);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return Plan();
  EXPECT_TRUE(ValidatePlan(*plan, world, lengths).ok()) << ValidatePlan(*plan, world, lengths);
  return *plan;
}

double Total(const Plan& plan) {
  return std::accumulate(plan.workload_after.begin(), plan.workload_after.end(), 0.0);
}

// The slowest GPU's time over the ideal (total workload over total speed,
// speeds normalized to mean 1): what max/mean is without speeds.
double TimeOverIdeal(const Plan& plan, const std::vector<double>& speeds) {
  const std::vector<double> time = TimePerRank(plan, speeds);
  return *std::max_element(time.begin(), time.end()) /
         (Total(plan) / static_cast<double>(plan.world_size));
}

TEST(RankSpeedsTest, ChecksNameTheFieldTheRankAndTheLimit) {
  EXPECT_TRUE(CheckRankSpeeds({}, 8).ok());
  EXPECT_TRUE(CheckRankSpeeds({1, 2, 0.5, 1}, 4).ok());
  EXPECT_THAT(CheckRankSpeeds({1, 1, 1}, 4).message(),
              HasSubstr("rank_speeds: 3 speeds for a world of 4 ranks"));
  EXPECT_THAT(CheckRankSpeeds({1, 0, 1, 1}, 4).message(), HasSubstr("rank_speeds[1] is 0"));
  EXPECT_THAT(CheckRankSpeeds({1, 1, -2, 1}, 4, "machine.rank_speeds").message(),
              HasSubstr("machine.rank_speeds[2] is -2"));
  EXPECT_THAT(CheckRankSpeeds({1, 1, 1, std::nan("")}, 4).message(),
              HasSubstr("rank_speeds[3] is nan"));
  EXPECT_THAT(CheckRankSpeeds({0.5, 1, 51, 1}, 4).message(),
              HasSubstr("rank 2 at 51 is over 100 times rank 0 at 0.5"));
  EXPECT_TRUE(CheckRankSpeeds({0.5, 1, 50, 1}, 4).ok());
}

TEST(RankSpeedsTest, ParsesAListOrRanksOfAnEvenWorld) {
  EXPECT_THAT(*ParseRankSpeeds("0.6,1,1,1", 4, "--rank-speeds"), ElementsAre(0.6, 1, 1, 1));
  EXPECT_THAT(*ParseRankSpeeds("2:0.5,0:0.75", 4, "--rank-speeds"),
              ElementsAre(0.75, 1, 0.5, 1));
  EXPECT_THAT(ParseRankSpeeds("1,1", 4, "--rank-speeds").status().message(),
              HasSubstr("--rank-speeds: 2 speeds for a world of 4 ranks"));
  EXPECT_THAT(ParseRankSpeeds("1,x,1,1", 4, "--rank-speeds").status().message(),
              HasSubstr("'x' is not a number"));
  EXPECT_THAT(ParseRankSpeeds("4:0.5", 4, "--rank-speeds").status().message(),
              HasSubstr("rank 4 in '4:0.5' is outside [0, 4)"));
  EXPECT_THAT(ParseRankSpeeds("1:0.5,1:0.7", 4, "--rank-speeds").status().message(),
              HasSubstr("rank 1 is named twice"));
  EXPECT_THAT(ParseRankSpeeds("1:0.5,0.7", 4, "--rank-speeds").status().message(),
              HasSubstr("'0.7' is not RANK:SPEED"));
  EXPECT_THAT(ParseRankSpeeds("1:0", 4, "--rank-speeds").status().message(),
              HasSubstr("--rank-speeds[1] is 0"));
}

TEST(RankSpeedsTest, OneSpeedForAllPlansExactlyAsNoSpeeds) {
  const CostModel cost = Flux();
  for (const std::string spec : {"g1n32", "g2n16", "g4n8", "g1n8+g2n4+g4n4"}) {
    const World world = MakeWorld(spec, 32);
    for (bool locality : {false, true}) {
      const RankLengths lengths = JointBatch(32, 3);
      BalancerOptions plain;
      plain.locality = locality;
      BalancerOptions even = plain;
      even.rank_speeds.assign(32, 2.5);  // any one speed: only ratios count
      const Plan a = PlanOrDie(world, cost, lengths, plain);
      const Plan b = PlanOrDie(world, cost, lengths, even);
      // 0.7 / mean(0.7) is not 1 in floating point: one speed is none.
      EXPECT_TRUE(NormalizedRankSpeeds(std::vector<double>(32, 0.7)).empty());
      ASSERT_EQ(a.chunks.size(), b.chunks.size()) << spec;
      for (size_t i = 0; i < a.chunks.size(); ++i) {
        EXPECT_EQ(a.chunks[i].dst_rank, b.chunks[i].dst_rank) << spec << " chunk " << i;
        EXPECT_EQ(a.chunks[i].length, b.chunks[i].length) << spec << " chunk " << i;
      }
      EXPECT_EQ(a.workload_after, b.workload_after) << spec;
      EXPECT_EQ(TimePerRank(b, even.rank_speeds), a.workload_after) << spec;
      EXPECT_EQ(MaxOverMeanLowerBound(world, cost, lengths, nullptr, even.rank_speeds),
                MaxOverMeanLowerBound(world, cost, lengths))
          << spec;
    }
  }
}

TEST(RankSpeedsTest, ASlowRankGetsItsShareOfTimeAndTheStepRunsAtTheBound) {
  const CostModel cost = Flux();
  const World world = MakeWorld("g1n8", 8);
  const RankLengths lengths = LowRes(8, 0);
  BalancerOptions options;
  options.rank_speeds = {1, 1, 1, 0.6, 1, 1, 1, 1};
  const Plan flops = PlanOrDie(world, cost, lengths, BalancerOptions());
  const Plan timed = PlanOrDie(world, cost, lengths, options);
  const double ideal_total_speed = 7.6;
  // Rank 3 holds about 0.6 of a healthy rank's work.
  const double healthy = Total(timed) / ideal_total_speed;
  EXPECT_NEAR(timed.workload_after[3], 0.6 * healthy, 0.01 * healthy);
  const double bound = MaxOverMeanLowerBound(world, cost, lengths, nullptr, options.rank_speeds);
  EXPECT_GE(TimeOverIdeal(timed, options.rank_speeds), bound * (1 - 1e-12));
  EXPECT_LT(TimeOverIdeal(timed, options.rank_speeds), 1.01);
  EXPECT_LT(bound, 1.01);
  // The FLOP-balanced plan runs at the slow rank's pace: 1/0.6 of its share.
  EXPECT_GT(TimeOverIdeal(flops, options.rank_speeds), 1.5);
  // Refinement alone (no locality) reaches the same.
  options.locality = false;
  EXPECT_LT(TimeOverIdeal(PlanOrDie(world, cost, lengths, options), options.rank_speeds), 1.01);
}

TEST(RankSpeedsTest, ABagRunsAtItsSlowestGpusPace) {
  const CostModel cost = Flux();
  const World world = MakeWorld("g2n4", 8);
  const RankLengths lengths = LowRes(8, 1);
  BalancerOptions options;
  options.rank_speeds = {1, 1, 0.5, 1, 1, 1, 1, 1};  // bag 1 = ranks 2, 3: speed 2 x 0.5
  const Plan plan = PlanOrDie(world, cost, lengths, options);
  const double bag1 = plan.workload_after[2] + plan.workload_after[3];
  const double others = Total(plan) - bag1;
  // Bag speeds 2, 1, 2, 2: bag 1 holds about a seventh of the work.
  EXPECT_NEAR(bag1 / others, 1.0 / 6, 0.01);
  const std::vector<double> time = TimePerRank(plan, options.rank_speeds);
  // Both GPUs of the slow bag wait for its slow one.
  EXPECT_NEAR(time[2], time[3], 1e-3 * time[2]);
  EXPECT_LT(TimeOverIdeal(plan, options.rank_speeds),
            1.01 * MaxOverMeanLowerBound(world, cost, lengths, nullptr, options.rank_speeds));
  // The bound counts the slow bag's lost speed: 8 GPUs of work on 7.
  EXPECT_GT(MaxOverMeanLowerBound(world, cost, lengths, nullptr, options.rank_speeds),
            8.0 / 7.5);
}

TEST(RankSpeedsTest, TheBoundHoldsForEveryPlanOnRandomFleets) {
  const CostModel cost = Flux();
  for (const std::string spec : {"g1n32", "g2n16", "g4n8", "g1n8+g2n4+g4n4"}) {
    const World world = MakeWorld(spec, 32);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<double> speeds(32);
      for (int32_t r = 0; r < 32; ++r) speeds[r] = 0.4 + 0.6 * ((r * 7 + step * 5) % 11) / 10.0;
      const RankLengths lengths = JointBatch(32, step);
      BalancerOptions options;
      options.rank_speeds = speeds;
      const double bound = MaxOverMeanLowerBound(world, cost, lengths, nullptr, speeds);
      const Plan timed = PlanOrDie(world, cost, lengths, options);
      const Plan flops = PlanOrDie(world, cost, lengths, BalancerOptions());
      EXPECT_GE(TimeOverIdeal(timed, speeds), bound * (1 - 1e-12)) << spec << " step " << step;
      EXPECT_GE(TimeOverIdeal(flops, speeds), bound * (1 - 1e-12)) << spec << " step " << step;
      // Never worse than leaving every sequence home, in time.
      Plan home = timed;
      home.workload_after = timed.workload_before;
      EXPECT_LE(TimeOverIdeal(timed, speeds), TimeOverIdeal(home, speeds) * (1 + 1e-12))
          << spec << " step " << step;
    }
  }
}

// The fleets on the paper's joint stream: one GPU at 0.6, and half
// the GPUs at 0.5. Bags of 4 and 8 reach the speed-aware bound to 0.1%
// (MULTIFIT fills the slow bags to their speed; the greedy alone sent a
// giant video to the slow bag: 1.15 in g4n8 with one at 0.6).
TEST(RankSpeedsTest, MixedFleetsPlanAtTheBoundInBagsOfFourAndEight) {
  const CostModel cost = Flux();
  std::vector<double> one_slow(32, 1.0), half_slow(32, 1.0);
  one_slow[3] = 0.6;
  for (int32_t r = 0; r < 16; ++r) half_slow[r] = 0.5;
  for (const std::string spec : {"g4n8", "g8n4"}) {
    const World world = MakeWorld(spec, 32);
    for (const std::vector<double>& speeds : {one_slow, half_slow}) {
      for (int64_t step = 0; step < 4; ++step) {
        const RankLengths lengths = JointBatch(32, step);
        BalancerOptions options;
        options.rank_speeds = speeds;
        const Plan plan = PlanOrDie(world, cost, lengths, options);
        const double bound = MaxOverMeanLowerBound(world, cost, lengths, nullptr, speeds);
        EXPECT_LE(TimeOverIdeal(plan, speeds), bound * 1.001) << spec << " step " << step;
        const Plan flops = PlanOrDie(world, cost, lengths, BalancerOptions());
        EXPECT_GT(TimeOverIdeal(flops, speeds), 1.4 * TimeOverIdeal(plan, speeds))
            << spec << " step " << step;
      }
    }
  }
}

// Replicas of one speed each, but not the same one: each replica's packing
// is scale-free (its slow GPUs plan as fast ones would), and the bound
// divides each replica's work by its own speed.
TEST(RankSpeedsTest, ReplicasOfDifferentSpeedsAreBoundedByTheirOwn) {
  const CostModel cost = Flux();
  const World world = MakeWorld("g1n32", 64);
  RankLengths lengths = JointBatch(32, 1);
  const RankLengths second = JointBatch(32, 2);
  for (const auto& rank : second) lengths.push_back(rank);
  std::vector<double> speeds(64, 1.0);
  for (int32_t r = 0; r < 32; ++r) speeds[r] = 0.5;
  BalancerOptions options;
  options.rank_speeds = speeds;
  const Plan timed = PlanOrDie(world, cost, lengths, options);
  const Plan flops = PlanOrDie(world, cost, lengths, BalancerOptions());
  // Within a replica one speed: the plan is the FLOP-balanced one.
  EXPECT_EQ(timed.workload_after, flops.workload_after);
  const double bound = MaxOverMeanLowerBound(world, cost, lengths, nullptr, speeds);
  EXPECT_GE(TimeOverIdeal(timed, speeds), bound * (1 - 1e-12));
  // The slow replica's work over its speed bounds it from below.
  double slow_work = 0, total = 0;
  for (int32_t r = 0; r < 64; ++r) {
    total += timed.workload_after[r];
    if (r < 32) slow_work += timed.workload_after[r];
  }
  const std::vector<double> normalized = NormalizedRankSpeeds(speeds);
  EXPECT_GE(bound, slow_work / (32 * normalized[0]) / (total / 64) * (1 - 1e-12));
}

TEST(RankSpeedsTest, PlansDependOnRatiosNotScale) {
  const CostModel cost = Flux();
  const World world = MakeWorld("g2n16", 32);
  const RankLengths lengths = JointBatch(32, 4);
  BalancerOptions small, large;
  for (int32_t r = 0; r < 32; ++r) {
    small.rank_speeds.push_back(r % 2 == 0 ? 1.0 : 1.5);  // every bag at its slower GPU, 1
    large.rank_speeds.push_back(r % 2 == 0 ? 2.0 : 3.0);
  }
  const Plan a = PlanOrDie(world, cost, lengths, small);
  const Plan b = PlanOrDie(world, cost, lengths, large);
  const Plan none = PlanOrDie(world, cost, lengths, BalancerOptions());
  EXPECT_EQ(a.workload_after, b.workload_after);
  // Every bag runs at one pace: the FLOP-balanced plan exactly.
  EXPECT_EQ(a.workload_after, none.workload_after);
}

TEST(RankSpeedsTest, TokenCapsAndMasksHoldWithSpeeds) {
  const CostModel cost = Flux();
  const World world = MakeWorld("g1n8+g2n4", 16);
  auto stream = MaskedStream::Create("video-blockcausal", 16, 5);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const MaskedStream::Step step = stream->Batch(0);
  BalancerOptions options;
  options.rank_speeds.assign(16, 1.0);
  options.rank_speeds[0] = 0.5;
  options.rank_speeds[9] = 0.7;
  const Plan plan = PlanOrDie(world, cost, step.lengths, options, &step.masks);
  const double bound =
      MaxOverMeanLowerBound(world, cost, step.lengths, &step.masks, options.rank_speeds);
  EXPECT_GE(TimeOverIdeal(plan, options.rank_speeds), bound * (1 - 1e-12));
  // A cap the unconstrained plan breaks is still hard under speeds.
  const std::vector<int64_t> tokens = plan.TokensPerRank();
  options.max_tokens_per_gpu = *std::max_element(tokens.begin(), tokens.end()) * 95 / 100;
  auto capped = BalanceGreedy(world, cost, step.lengths, options, &step.masks);
  if (capped.ok()) {
    for (int64_t t : capped->TokensPerRank()) EXPECT_LE(t, options.max_tokens_per_gpu);
  } else {
    EXPECT_EQ(capped.status().code(), absl::StatusCode::kResourceExhausted);
  }
}

TEST(RankSpeedsTest, BalancersRefuseBadSpeeds) {
  const World world = MakeWorld("g1n4", 4);
  BalancerOptions options;
  options.rank_speeds = {1, 1, 1};
  auto plan = BalanceGreedy(world, Flux(), RankLengths{{10}, {20}, {30}, {40}}, options);
  EXPECT_THAT(plan.status().message(), HasSubstr("rank_speeds: 3 speeds for a world of 4"));
  auto layout = AutoLayout::Parse("auto");
  ASSERT_TRUE(layout.ok());
  auto prices = CommPrices::Create(Machine(), Flux());
  ASSERT_TRUE(prices.ok());
  options.rank_speeds = {1, 1, 0, 1};
  auto automatic = BalanceAuto(*layout, 4, Flux(), *prices, {{10}, {20}, {30}, {40}}, options);
  EXPECT_THAT(automatic.status().message(), HasSubstr("rank_speeds[2] is 0"));
}

TEST(RankSpeedsTest, AutoAndThePredictedStepCountTheSlowGpu) {
  const CostModel cost = Flux();
  auto layout = AutoLayout::Parse("auto");
  ASSERT_TRUE(layout.ok());
  Machine machine;
  machine.gpus_per_node = 8;
  auto prices = CommPrices::Create(machine, cost);
  ASSERT_TRUE(prices.ok());
  const RankLengths lengths = JointBatch(32, 2);
  BalancerOptions options;
  options.rank_speeds.assign(32, 1.0);
  options.rank_speeds[5] = 0.6;
  auto timed = BalanceAuto(*layout, 32, cost, *prices, lengths, options);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE(ValidatePlan(timed->plan, timed->world, lengths).ok());
  auto flops = BalanceAuto(*layout, 32, cost, *prices, lengths, BalancerOptions());
  ASSERT_TRUE(flops.ok()) << flops.status();
  const std::vector<double> speeds = NormalizedRankSpeeds(options.rank_speeds);
  // Auto's own prediction is the plan's, and the FLOP-balanced plan is
  // slower on the slow fleet.
  const PredictedStep timed_step =
      PredictStep(timed->plan, timed->world, lengths, cost, *prices, nullptr, speeds);
  EXPECT_DOUBLE_EQ(timed_step.time, timed->predicted.time);
  EXPECT_LE(timed_step.time,
            PredictStep(flops->plan, flops->world, lengths, cost, *prices, nullptr, speeds).time);
  // The predicted compute of a one-GPU bag is its workload over its speed.
  const World g1 = MakeWorld("g1n32", 32);
  const Plan plan = PlanOrDie(g1, cost, lengths, options);
  const PredictedStep step = PredictStep(plan, g1, lengths, cost, *prices, nullptr, speeds);
  const std::vector<double> time = TimePerRank(plan, options.rank_speeds);
  EXPECT_NEAR(step.max_compute, *std::max_element(time.begin(), time.end()),
              1e-9 * step.max_compute);
}

}  // namespace
}  // namespace knapformer
