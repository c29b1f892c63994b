// The paper's 12 cells (3 scenarios x 4 topologies, 32 GPUs, d = 3072,
// gamma = 0.49, 20 steps) against the reference implementation's figures in
// docs/background.md; and the masked streams (planner/masked_stream.h):
// plans made with the masks against mask-blind and token-count plans.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/lengths_file.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/masked_stream.h"
#include "planner/topology.h"
#include "planner/validate.h"
#include "tools/simulate.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
  options.topologies = {"g1n32", "g2n16", "g4n8", "g8n4"};  // the paper's table
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

// Issue 16's figures: on the curriculum stream (low-res, then mixed-res, then
// joint), auto's predicted step time beats every fixed topology over the
// whole stream, and in each phase it is no worse than that phase's best.
TEST(ScenarioTest, AutoBeatsEveryFixedTopologyOnTheCurriculum) {
  SimulateOptions options;
  options.data = "curriculum";
  options.steps = 12;
  ASSERT_TRUE(options.topologies.empty());  // the world's defaults
  auto results = Simulate(options);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 5u);
  EXPECT_EQ(results->back().topology, "auto:max_bag=8");
  const TopologyResult& automatic = results->back();
  ASSERT_TRUE(automatic.predicted);
  ASSERT_EQ(automatic.phase_step_seconds.size(), 3u);
  for (size_t t = 0; t + 1 < results->size(); ++t) {
    const TopologyResult& fixed = (*results)[t];
    SCOPED_TRACE(fixed.topology);
    EXPECT_LT(automatic.step_seconds.mean, fixed.step_seconds.mean);
    for (size_t phase = 0; phase < 3; ++phase) {
      EXPECT_LE(automatic.phase_step_seconds[phase].mean,
                fixed.phase_step_seconds[phase].mean)
          << "phase " << phase;
    }
  }
  // It changes layouts with the data: one-GPU bags for low-res images and
  // larger bags for the rest.
  ASSERT_GE(automatic.gpus_in_bags_of_size.size(), 3u);
  EXPECT_GT(automatic.gpus_in_bags_of_size[0], 0.2);
  EXPECT_GT(automatic.gpus_in_bags_of_size[2], 0.2);
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

// Per-step figures of one planner on one cell.
struct StepFigures {
  double max_over_mean = 0;
  int64_t moved = 0;
  int64_t total = 0;
};

std::vector<StepFigures> PlanSteps(const std::string& data, const std::string& topology,
                                   const BalancerOptions& options) {
  std::vector<StepFigures> steps;
  auto codes = ParseDataCodes(ScenarioCodes(data));
  auto stream = DataStream::Create(*codes, 32, /*seed=*/0);
  auto world = World::Create(*Topology::Parse(topology), 32);
  auto cost = CostModel::Create(3072, 0.49);
  EXPECT_TRUE(codes.ok() && stream.ok() && world.ok() && cost.ok());
  if (!stream.ok() || !world.ok() || !cost.ok()) return steps;
  for (int64_t step = 0; step < SimulateOptions().steps; ++step) {
    const RankLengths lengths = stream->Batch(step);
    auto plan = BalanceGreedy(*world, *cost, lengths, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return steps;
    EXPECT_TRUE(ValidatePlan(*plan, *world, lengths).ok());
    steps.push_back({ComputeBalanceStats(plan->workload_after).max_over_mean,
                     plan->MovedTokens(), plan->TotalTokens()});
  }
  return steps;
}

// Issue 6's bar: in each of the 12 cells and in every step, the
// locality-aware planner (the default) reaches the max/mean of the paper's
// greedy and of the balanced plan (greedy + refinement) within 0.1%, and
// over the steps moves fewer tokens than either; at most 30% of the tokens
// on low-res g1n32. It never moves more than the balanced plan in a step
// (it is only taken when it moves fewer), but may move a little more than
// the paper's greedy in a step where that greedy is less balanced (joint
// g4n8 and g8n4: by at most 0.4%, at 1.0005 max/mean against 1.0024).
TEST(ScenarioTest, LocalityMovesFewerTokensAtTheSameMaxOverMeanInEveryStep) {
  BalancerOptions paper;
  paper.refine_rounds = 0;
  paper.locality = false;
  BalancerOptions balanced;
  balanced.locality = false;
  const BalancerOptions local;
  ASSERT_TRUE(local.locality);
  for (const std::string data : {"low-res", "mixed-res", "joint"}) {
    for (const std::string topology : {"g1n32", "g2n16", "g4n8", "g8n4"}) {
      SCOPED_TRACE(data + " " + topology);
      const std::vector<StepFigures> with_locality = PlanSteps(data, topology, local);
      int64_t moved = 0, total = 0;
      for (const StepFigures& step : with_locality) {
        moved += step.moved;
        total += step.total;
      }
      for (const BalancerOptions& baseline : {paper, balanced}) {
        SCOPED_TRACE(baseline.refine_rounds == 0 ? "against the paper's greedy"
                                                 : "against the balanced plan");
        const std::vector<StepFigures> base = PlanSteps(data, topology, baseline);
        ASSERT_EQ(base.size(), with_locality.size());
        int64_t base_moved = 0;
        for (size_t s = 0; s < base.size(); ++s) {
          EXPECT_LE(with_locality[s].max_over_mean, base[s].max_over_mean * 1.001) << "step " << s;
          if (baseline.refine_rounds > 0) {
            EXPECT_LE(with_locality[s].moved, base[s].moved) << "step " << s;
          }
          base_moved += base[s].moved;
        }
        EXPECT_LT(moved, base_moved);
      }
      if (data == "low-res" && topology == "g1n32") {
        EXPECT_LE(static_cast<double>(moved) / total, 0.30);
      }
    }
  }
}

// Issue 36's figures: on each masked stream at 32 and 256 GPUs, 10 steps,
// the default planner (locality on), the plans made with the masks are, by
// the GPUs' true work, better balanced than the mask-blind plan and the
// token-count plan in every topology, and within 1% of the bound in every
// fixed topology. Video in one-GPU bags needs both halves of
// docs/planner.md's "Masked data streams": MULTIFIT (planner/multifit.h)
// took g1n256 from 1.0337 to 1.0072 on these steps and g1n32 from 1.0248
// to 1.0218; the bound's packing terms (planner/packing_bound.h) raised
// theirs to 1.0019 and 1.0124, so that it shows what a packing of whole
// clips can reach. In two-GPU bags masked
// refinement's partners (planner/balancer.cc, kMaskedRefinePartners) bring
// video within 1%, where pairing the busiest bag with the idlest alone
// stopped at 1.0118 / 1.0121. auto chooses layouts by predicted step time,
// communication included, not by max/mean: its row is compared with the
// blind and token plans but not with the bound.
constexpr double kOverBound = 1.01;

std::vector<std::string> FixedLayouts(int64_t world) { return HomogeneousSpecs(world, 8); }

// The defaults follow --world: a small world gets the layouts that fit it,
// and auto's row names the largest bag it may use there.
TEST(ScenarioTest, TheDefaultTopologiesFollowTheWorld) {
  for (const auto& [world, names] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {4, {"g1n4", "g2n2", "g4n1", "auto:max_bag=4"}},
           {2, {"g1n2", "g2n1", "auto:max_bag=2"}},
           {32, {"g1n32", "g2n16", "g4n8", "g8n4", "auto:max_bag=8"}}}) {
    SimulateOptions options;
    options.data = "llm-packed";  // the scenarios' codes are for 32 GPUs; a masked stream is not
    options.world = world;
    options.steps = 2;
    auto results = Simulate(options);
    ASSERT_TRUE(results.ok()) << "world " << world << ": " << results.status();
    std::vector<std::string> got;
    for (const TopologyResult& result : *results) got.push_back(result.topology);
    EXPECT_EQ(got, names) << "world " << world;
  }
  SimulateOptions empty_entry;
  empty_entry.topologies = {"g1n32", ""};
  EXPECT_THAT(std::string(Simulate(empty_entry).status().message()),
              HasSubstr("--topology: an empty entry"));
}

std::vector<TopologyResult> RunMasked(const std::string& data, int64_t world) {
  SimulateOptions options;
  options.data = data;
  options.world = world;
  options.steps = 10;
  options.topologies = FixedLayouts(world);
  options.topologies.push_back("auto");
  auto results = Simulate(options);
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? *results : std::vector<TopologyResult>();
}

TEST(ScenarioTest, MaskedPlansBeatMaskBlindAndTokenPlansAndReachTheBound) {
  for (const std::string& data : MaskedScenarioNames()) {
    for (const int64_t world : {32, 256}) {
      const std::vector<TopologyResult> results = RunMasked(data, world);
      ASSERT_EQ(results.size(), 5u);
      for (size_t t = 0; t < results.size(); ++t) {
        const TopologyResult& r = results[t];
        SCOPED_TRACE(absl::StrCat(data, " ", world, " ", r.topology, ": tokens ",
                                  r.tokens_true.mean, ", blind ", r.blind_true.mean,
                                  ", masked ", r.masked_true.mean, ", bound ",
                                  r.lower_bound.mean));
        ASSERT_TRUE(r.masked);
        EXPECT_EQ(r.masked_true.mean, r.max_over_mean_after.mean);
        EXPECT_LT(r.masked_true.mean, r.blind_true.mean);
        EXPECT_LT(r.masked_true.mean, r.tokens_true.mean);
        EXPECT_GE(r.masked_true.mean, r.lower_bound.mean * (1 - 1e-12));
        if (t + 1 < results.size()) {  // not auto
          EXPECT_LE(r.masked_true.mean, r.lower_bound.mean * kOverBound);
        }
      }
    }
  }
}

// The paper's streams keep their table and leave the masked fields unset;
// a masked stream prints its own and is refused where it cannot be priced.
TEST(ScenarioTest, MaskedStreamsHaveTheirOwnTableAndLimits) {
  SimulateOptions options;
  options.steps = 2;
  options.topologies = {"g8n4"};
  auto paper = Simulate(options);
  ASSERT_TRUE(paper.ok()) << paper.status();
  EXPECT_FALSE(paper->front().masked);
  EXPECT_EQ(paper->front().blind_true.mean, 0);
  EXPECT_THAT(FormatSimulation(options, *paper), HasSubstr("WIR before"));

  options.data = "llm-packed";
  auto masked = Simulate(options);
  ASSERT_TRUE(masked.ok()) << masked.status();
  const std::string table = FormatSimulation(options, *masked);
  EXPECT_THAT(table, HasSubstr("data llm-packed (LLM documents packed to 131072 tokens"));
  EXPECT_THAT(table, HasSubstr("tokens    mask-blind masked (mean ^max)"));
  EXPECT_THAT(table, HasSubstr("the plans made with the masks, priced with them"));
  EXPECT_THAT(table, Not(HasSubstr("WIR before")));

  options.data = "llm-packed;mixed-res";
  EXPECT_THAT(std::string(Simulate(options).status().message()),
              HasSubstr("--data: the masked stream llm-packed cannot be a phase; give it alone"));
  options.data = "interleaved";
  options.cost_model = CostKind::kLinear;
  EXPECT_THAT(std::string(Simulate(options).status().message()),
              HasSubstr("--cost-model linear: the masked stream interleaved compares plans by "
                        "the pairs they attend; use --cost-model transformer or measured"));
}

// A user's lengths file: simulated as the paper's streams are (every plan
// validated), its masks priced, and the advice names the fastest row and
// what balancing buys against the same steps unbalanced.
TEST(ScenarioTest, AUsersLengthsFileIsSimulatedAndAdvised) {
  std::string text = "# tokens[,mask]\n";
  for (int i = 0; i < 200; ++i) {
    // A long tail: one sample in 20 is 16k tokens, the rest 256..2k.
    absl::StrAppend(&text, i % 20 == 0 ? 16384 : 256 + (i * 97) % 1792, "\n");
  }
  auto file = ParseLengthsFile(text, "mine.txt");
  ASSERT_TRUE(file.ok()) << file.status();
  SimulateOptions options;
  options.lengths = *file;
  options.data = "mine.txt";
  options.batching.tokens_per_gpu = 16384;
  options.world = 8;
  options.steps = 6;
  options.topologies = {"g1n8", "g2n4", "g4n2", "auto"};
  auto results = Simulate(options);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 4u);
  for (const TopologyResult& r : *results) {
    EXPECT_FALSE(r.masked);
    ASSERT_TRUE(r.predicted);
    EXPECT_GT(r.step_seconds_before.mean, 0) << r.topology;
    // Balancing never predicts slower compute than none; with the route and
    // Ulysses priced it may cost a little on g1n8, where little can move.
    EXPECT_LE(r.max_over_mean_after.mean, r.max_over_mean_before.mean + 1e-9) << r.topology;
  }
  // g4n2 spreads a 16k sample over 4 GPUs; g1n8 cannot split it.
  EXPECT_LT((*results)[2].step_seconds.mean, (*results)[0].step_seconds.mean);
  const std::string table = FormatSimulation(options, *results);
  EXPECT_THAT(table, HasSubstr("data mine.txt (200 samples; up to 16384 tokens per GPU, "
                               "shuffled with seed 0)"));
  EXPECT_THAT(table, HasSubstr("unbalanced  buys"));
  EXPECT_THAT(table, HasSubstr("advice: --topology "));
  EXPECT_THAT(table, HasSubstr("faster than the same step without balancing"));

  // Masks make it a masked stream, which only the transformer cost prices.
  absl::StrAppend(&text, "4096,causal\n300,spans=100:c;200:f\n");
  options.lengths = *ParseLengthsFile(text, "mine.txt");
  results = Simulate(options);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE(results->front().masked);
  EXPECT_THAT(FormatSimulation(options, *results), HasSubstr("202 samples, 2 with masks"));
  options.cost_model = CostKind::kLinear;
  EXPECT_THAT(std::string(Simulate(options).status().message()),
              HasSubstr("--cost-model linear: mine.txt has masks"));
}

}  // namespace
}  // namespace knapformer
