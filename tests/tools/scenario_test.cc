// The paper's 12 cells (3 scenarios x 4 topologies, 32 GPUs, d = 3072,
// gamma = 0.49, 20 steps) against the reference implementation's figures in
// shared/notes/algorithm.md.

#include <map>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tools/simulate.h"

namespace knapformer {
namespace {

// Mean WIR after balancing, reference implementation, 20 batches.
const std::map<std::pair<std::string, std::string>, double> kReferenceWir = {
    {{"low-res", "g1n32"}, 1.0009},   {{"low-res", "g2n16"}, 1.0003},
    {{"low-res", "g4n8"}, 1.0001},    {{"low-res", "g8n4"}, 1.0000},
    {{"mixed-res", "g1n32"}, 4.063},  {{"mixed-res", "g2n16"}, 1.334},
    {{"mixed-res", "g4n8"}, 1.0057},  {{"mixed-res", "g8n4"}, 1.0008},
    {{"joint", "g1n32"}, 4.824},      {{"joint", "g2n16"}, 1.674},
    {{"joint", "g4n8"}, 1.0038},      {{"joint", "g8n4"}, 1.0018},
};

// The balance comparisons are about the paper's balancing, so locality (which
// trades a little WIR, never more than 0.05% of max/mean, for tokens moved)
// is off unless asked for.
std::vector<TopologyResult> RunScenario(const std::string& data, uint64_t seed, int32_t rounds,
                                        bool locality = false) {
  SimulateOptions options;
  options.data = data;
  options.seed = seed;
  options.refine_rounds = rounds;
  options.locality = locality;
  auto results = Simulate(options);
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? *results : std::vector<TopologyResult>();
}

TEST(ScenarioTest, RefinedPlannerNeverLosesToThePapersGreedyOnTheSameData) {
  for (const std::string data : {"low-res", "mixed-res", "joint"}) {
    const auto refined = RunScenario(data, 0, SimulateOptions().refine_rounds);
    const auto paper = RunScenario(data, 0, 0);
    ASSERT_EQ(refined.size(), 4u);
    ASSERT_EQ(paper.size(), 4u);
    for (size_t t = 0; t < 4; ++t) {
      SCOPED_TRACE(data + " " + refined[t].topology);
      EXPECT_LE(refined[t].wir_after.mean, paper[t].wir_after.mean + 1e-9);
      EXPECT_LE(refined[t].max_over_mean_after.mean, paper[t].max_over_mean_after.mean + 1e-9);
      // Within 0.1% of what any plan could reach.
      EXPECT_LE(refined[t].max_over_mean_after.mean, refined[t].lower_bound.mean * 1.001);
    }
  }
}

TEST(ScenarioTest, MatchesOrBeatsTheReferenceFigures) {
  // Our data streams follow the paper's formulas but not its random numbers:
  // a 20-step mean moves by up to ~0.5% between seeds where one unsplittable
  // image sets the maximum (g1, g2). Averaging 5 seeds of 20 steps and
  // allowing that 0.5% keeps the comparison about the planner, not the dice.
  constexpr int kSeeds = 5;
  for (const std::string data : {"low-res", "mixed-res", "joint"}) {
    std::vector<double> sum(4, 0.0);
    std::vector<std::string> names(4);
    for (int seed = 0; seed < kSeeds; ++seed) {
      const auto results = RunScenario(data, seed, SimulateOptions().refine_rounds);
      ASSERT_EQ(results.size(), 4u);
      for (size_t t = 0; t < 4; ++t) {
        sum[t] += results[t].wir_after.mean;
        names[t] = results[t].topology;
      }
    }
    for (size_t t = 0; t < 4; ++t) {
      const double reference = kReferenceWir.at({data, names[t]});
      const double ours = sum[t] / kSeeds;
      EXPECT_LE(ours, reference * 1.005) << data << " " << names[t] << ": " << ours
                                         << " vs reference " << reference;
    }
  }
}

// Issue 6's bar: at the same max/mean (within 0.1%), the locality-aware
// planner moves fewer tokens than the balanced planner in every cell, and at
// most 30% on low-res g1n32.
TEST(ScenarioTest, LocalityMovesFewerTokensAtTheSameMaxOverMean) {
  for (const std::string data : {"low-res", "mixed-res", "joint"}) {
    const auto greedy = RunScenario(data, 0, SimulateOptions().refine_rounds, false);
    const auto local = RunScenario(data, 0, SimulateOptions().refine_rounds, true);
    ASSERT_EQ(greedy.size(), 4u);
    ASSERT_EQ(local.size(), 4u);
    for (size_t t = 0; t < 4; ++t) {
      SCOPED_TRACE(data + " " + local[t].topology);
      // Per step, not only on average.
      EXPECT_LE(local[t].max_over_mean_after.max, greedy[t].max_over_mean_after.max * 1.001);
      EXPECT_LE(local[t].max_over_mean_after.mean, greedy[t].max_over_mean_after.mean * 1.001);
      EXPECT_LT(local[t].moved_fraction.mean, greedy[t].moved_fraction.mean);
      EXPECT_LE(local[t].moved_fraction.max, greedy[t].moved_fraction.max);
    }
    if (data == "low-res") {
      EXPECT_LE(local[0].moved_fraction.mean, 0.30) << local[0].topology;
    }
  }
}

}  // namespace
}  // namespace knapformer
