#include "planner/advice.h"

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

AdviceRow Row(const std::string& topology, double seconds, double before = 2.0,
              const std::string& cost_model = "") {
  return {topology, cost_model, seconds, before};
}

// simulate's wording: microseconds against the same step unbalanced.
AdviceWording Simulate() {
  AdviceWording wording;
  wording.baseline = "the same step without balancing";
  return wording;
}

// replay's: milliseconds, of measured compute and modelled communication.
AdviceWording Replay() {
  AdviceWording wording;
  wording.unit = AdviceWording::Unit::kMilliseconds;
  wording.seconds_note = " (measured compute, modelled communication)";
  return wording;
}

TEST(AdviceTest, ChoosesTheFastestAndNamesTheSlowest) {
  const std::vector<AdviceRow> rows = {Row("g1n32", 3e-3, 4e-3), Row("g2n16", 2e-3, 4e-3),
                                       Row("g4n8", 2.05e-3, 4e-3)};
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->fastest, 1u);
  EXPECT_EQ(choice->chosen, 1u);
  ASSERT_TRUE(choice->slowest.has_value());
  EXPECT_EQ(*choice->slowest, 0u);
  EXPECT_EQ(TopologyAdvice(rows, Simulate()),
            "advice: --topology g2n16: 2000.0us per block on the slowest GPU, 2.00x faster "
            "than the same step without balancing (4000.0us); g1n32 would be 1.50x slower");
}

TEST(AdviceTest, TheFirstOfEqualFastestWins) {
  const std::vector<AdviceRow> rows = {Row("g2n4", 1.0), Row("g4n2", 1.0), Row("g1n8", 1.0)};
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->chosen, 0u);
  EXPECT_FALSE(choice->slowest.has_value());
}

TEST(AdviceTest, PrefersAutoWithinOnePercentOfTheFastestAndSaysSo) {
  const std::vector<AdviceRow> rows = {Row("g1n8", 1.0), Row("g2n4", 0.9), Row("auto", 0.905)};
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->fastest, 1u);
  EXPECT_EQ(choice->chosen, 2u);
  // The line replay prints (tests/python/test_replay.py's figures).
  EXPECT_EQ(TopologyAdvice(rows, Replay()),
            "advice: --topology auto: 905ms per block on the slowest GPU (measured compute, "
            "modelled communication), 2.21x faster than without balancing (2e+03ms) (within "
            "1% of g2n4, and it adapts to the data); g1n8 would be 1.10x slower");
  // And simulate's.
  EXPECT_EQ(TopologyAdvice(rows, Simulate()),
            "advice: --topology auto: 905000.0us per block on the slowest GPU, 2.21x faster "
            "than the same step without balancing (2000000.0us) (within 1% of g2n4, and it "
            "adapts to the data); g1n8 would be 1.10x slower");
}

TEST(AdviceTest, AutoMoreThanOnePercentSlowerIsNotPreferred) {
  const std::vector<AdviceRow> rows = {Row("auto", 0.91), Row("g2n4", 0.9)};
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->chosen, 1u);
  EXPECT_EQ(TopologyAdvice(rows, Simulate()).find("within 1%"), std::string::npos);
}

TEST(AdviceTest, TheFirstAutoWithinOnePercentIsChosen) {
  // Any auto spec (AutoLayout::Matches), the first one within 1%.
  const std::vector<AdviceRow> rows = {Row("g1n8", 0.9), Row("auto:max_bag=4", 0.905),
                                       Row("auto", 0.901)};
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->fastest, 0u);
  EXPECT_EQ(choice->chosen, 1u);
  // Not an auto spec: not preferred.
  EXPECT_EQ(ChooseTopology({Row("g1n8", 0.9), Row("automatic", 0.905)})->chosen, 0u);
}

TEST(AdviceTest, NamesTheSlowestOnlyWhenMoreThanFivePercentSlower) {
  const std::optional<AdviceChoice> close = ChooseTopology({Row("g1n8", 1.0), Row("g2n4", 1.04)});
  ASSERT_TRUE(close.has_value());
  EXPECT_FALSE(close->slowest.has_value());
  EXPECT_EQ(TopologyAdvice({Row("g1n8", 1.0), Row("g2n4", 1.04)}, Simulate()).find("would be"),
            std::string::npos);
  const std::vector<AdviceRow> rows = {Row("g1n8", 1.0), Row("g2n4", 1.06), Row("g4n2", 1.03)};
  const std::optional<AdviceChoice> far = ChooseTopology(rows);
  ASSERT_TRUE(far.has_value());
  ASSERT_TRUE(far->slowest.has_value());
  EXPECT_EQ(*far->slowest, 1u);
  const std::string line = TopologyAdvice(rows, Simulate());
  EXPECT_EQ(line.substr(line.rfind(';')), "; g2n4 would be 1.06x slower");
}

TEST(AdviceTest, NamesTheCostModelOnlyWhenTheRowsHoldMoreThanOne) {
  // Communication is in the seconds; the rows' cost models differ.
  const std::vector<AdviceRow> rows = {Row("g1n8", 1.0, 2.0, "transformer"),
                                       Row("g4n2", 1.1, 2.0, "measured"),
                                       Row("g1n8", 0.99, 2.0, "measured")};
  const std::string line = TopologyAdvice(rows, Replay());
  EXPECT_EQ(line.rfind("advice: --topology g1n8 --cost-model measured: 990ms per block", 0), 0u)
      << line;
  EXPECT_EQ(line.substr(line.rfind(';')), "; g4n2 would be 1.11x slower");
  const std::vector<AdviceRow> one = {Row("g1n8", 1.0, 2.0, "transformer"),
                                      Row("g2n4", 0.9, 2.0, "transformer")};
  EXPECT_EQ(TopologyAdvice(one, Replay()).rfind("advice: --topology g2n4: 900ms per block", 0),
            0u);
}

TEST(AdviceTest, EndsWithTheTrainersCallWhenGivenItsArguments) {
  AdviceWording wording = Replay();
  wording.trainer_arguments = "gamma=0.8, machine={'gpus_per_node': 4}";
  wording.measured_arguments = "cost_table=json.load(open('t.json'))";
  const std::vector<AdviceRow> rows = {Row("g1n8", 1.0, 2.0, "transformer"),
                                       Row("auto", 0.5, 2.0, "measured")};
  std::string line = TopologyAdvice(rows, wording);
  EXPECT_EQ(line.substr(line.rfind("; in the trainer")),
            "; in the trainer: SequenceBalancer(\"auto\", gamma=0.8, machine={'gpus_per_node': 4}, "
            "cost_model=\"measured\", cost_table=json.load(open('t.json')))");
  // The transformer model is SequenceBalancer's default: not spelled out.
  line = TopologyAdvice({Row("g1n8", 1.0, 2.0, "transformer"), Row("g2n4", 1.5, 2.0,
                                                                   "transformer")}, wording);
  EXPECT_EQ(line.substr(line.rfind("; in the trainer")),
            "; in the trainer: SequenceBalancer(\"g1n8\", gamma=0.8, machine={'gpus_per_node': 4})");
  // Without arguments (the default wording) the line stops at the advice.
  EXPECT_EQ(TopologyAdvice(rows, Replay()).find("in the trainer"), std::string::npos);
}

TEST(AdviceTest, MachineArgumentNamesWhatDiffersFromTheDefault) {
  EXPECT_EQ(MachineArgument(Machine()), "");
  Machine cpu;
  cpu.flops_per_second = 2.5e11;
  cpu.gpus_per_node = 4;
  EXPECT_EQ(MachineArgument(cpu),
            "machine={\"flops_per_second\": 2.5e+11, \"gpus_per_node\": 4}");
  Machine links;
  links.inter_node_bytes_per_second = 12.5e9;
  links.blocks_per_route = 57;
  EXPECT_EQ(MachineArgument(links),
            "machine={\"inter_node_bytes_per_second\": 1.25e+10, \"blocks_per_route\": 57}");
}

TEST(AdviceTest, ChoosesNothingWithoutRowsOrTimes) {
  EXPECT_FALSE(ChooseTopology({}).has_value());
  EXPECT_EQ(TopologyAdvice({}, Simulate()), "");
  // No prediction (simulate without the transformer model): zero seconds.
  const std::vector<AdviceRow> zero = {Row("g1n8", 0.0, 0.0), Row("auto", 0.0, 0.0)};
  EXPECT_FALSE(ChooseTopology(zero).has_value());
  EXPECT_EQ(TopologyAdvice(zero, Simulate()), "");
  // The fastest is what counts: one zero row among timed ones.
  EXPECT_FALSE(ChooseTopology({Row("g1n8", 1.0), Row("g2n4", 0.0)}).has_value());
}

}  // namespace
}  // namespace knapformer
