#include "planner/plan_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/balancer.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(PlanJsonTest, ParsesAFullRequest) {
  auto request = ParsePlanRequest(
      R"({"topology": "g1n2+g2n1+g4n1", "d_model": 1024, "gamma": 0.3,
          "ranks": [[10, 20], [], [0], [5], [], [], [], [2147483648]]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->topology, "g1n2+g2n1+g4n1");
  EXPECT_EQ(request->d_model, 1024);
  EXPECT_DOUBLE_EQ(request->gamma, 0.3);
  ASSERT_EQ(request->ranks.size(), 8u);
  EXPECT_EQ(request->ranks[0], (std::vector<int64_t>{10, 20}));
  EXPECT_TRUE(request->ranks[1].empty());
  EXPECT_EQ(request->ranks[7][0], int64_t{1} << 31);
}

TEST(PlanJsonTest, DefaultsDModelAndGamma) {
  auto request = ParsePlanRequest(R"({"topology": "g1n1", "ranks": [[1]]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->d_model, 3072);
  EXPECT_DOUBLE_EQ(request->gamma, 0.49);
  EXPECT_EQ(request->token_bytes, 2 * 3072);
}

TEST(PlanJsonTest, TokenBytesDefaultsToABf16HiddenStateOfTheRequestsDModel) {
  auto request = ParsePlanRequest(R"({"topology": "g1n1", "d_model": 1000, "ranks": [[1]]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->token_bytes, 2000);
  request = ParsePlanRequest(
      R"({"topology": "g1n1", "d_model": 1000, "token_bytes": 0, "ranks": [[1]]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->token_bytes, 0);
  request = ParsePlanRequest(
      R"({"topology": "g1n1", "token_bytes": 16777216, "ranks": [[1]]})");
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->token_bytes, 16777216);
}

TEST(PlanJsonTest, NamesTheBadField) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "input: not valid JSON"},
      {"{", "input: not valid JSON"},
      {"[1]", "input: must be a JSON object"},
      {R"({"ranks": [[1]]})", "topology: missing"},
      {R"({"topology": 3, "ranks": [[1]]})", "topology: must be a string"},
      {R"({"topology": "g1n1"})", "ranks: missing"},
      {R"({"topology": "g1n1", "ranks": {}})", "ranks: must be an array"},
      {R"({"topology": "g1n1", "ranks": []})", "ranks: must list at least one rank"},
      {R"({"topology": "g1n1", "ranks": [3]})", "ranks[0]: must be an array of lengths"},
      {R"({"topology": "g1n2", "ranks": [[1], [2, 1.5]]})", "ranks[1][1]: must be an integer"},
      {R"({"topology": "g1n2", "ranks": [[1], [2, "3"]]})", "ranks[1][1]: must be an integer"},
      {R"({"topology": "g1n2", "ranks": [[1], [2, -3]]})",
       "ranks[1][1]: sequence length -3 is outside [0, 2147483648]"},
      {R"({"topology": "g1n1", "ranks": [[2147483649]]})",
       "ranks[0][0]: sequence length 2147483649 is outside"},
      {R"({"topology": "g1n1", "ranks": [[99999999999999999999]]})", "ranks[0][0]"},
      {R"({"topology": "g1n1", "d_model": 2.5, "ranks": [[1]]})", "d_model: must be an integer"},
      {R"({"topology": "g1n1", "d_model": 99999999999, "ranks": [[1]]})",
       "d_model: must be in [1, 65536]"},
      {R"({"topology": "g1n1", "gamma": "x", "ranks": [[1]]})", "gamma: must be a number"},
      {R"({"topology": "g1n1", "token_bytes": 1.5, "ranks": [[1]]})",
       "token_bytes: must be an integer"},
      {R"({"topology": "g1n1", "token_bytes": -1, "ranks": [[1]]})",
       "token_bytes: must be in [0, 16777216]"},
      {R"({"topology": "g1n1", "token_bytes": 16777217, "ranks": [[1]]})",
       "token_bytes: must be in [0, 16777216]"},
      {R"({"topology": "g1n1", "ranks": [[1]], "rank": 3})", "rank: unknown field"},
      {R"({"topology": "auto", "machine": 8, "ranks": [[1]]})",
       "machine: must be an object of machine fields"},
      {R"({"topology": "auto", "machine": {"gpus": 8}, "ranks": [[1]]})",
       "machine.gpus: unknown field (expected flops_per_second,"},
      {R"({"topology": "auto", "machine": {"gpus_per_node": 2.5}, "ranks": [[1]]})",
       "machine.gpus_per_node: must be an integer"},
      {R"({"topology": "auto", "machine": {"flops_per_second": "fast"}, "ranks": [[1]]})",
       "machine.flops_per_second: must be a number"},
      {R"({"topology": "auto", "machine": {"gpus_per_node": 0}, "ranks": [[1]]})",
       "machine.gpus_per_node: 0 is outside [1, 65536]"},
      {R"({"topology": "auto", "machine": {"element_bytes": 99999999999}, "ranks": [[1]]})",
       "machine.element_bytes: 99999999999 is not a 32-bit integer"},
      // Found by plan_json_fuzzer: a number past a double was an uncaught
      // exception (the process aborted).
      {"77777777777777777777777777E777277E7772", "input: a number is out of range"},
      {"1E400", "input: a number is out of range"},
      {R"({"topology": "g1n1", "gamma": 1E400, "ranks": [[1]]})",
       "input: a number is out of range"},
  };
  for (const auto& [text, message] : cases) {
    auto request = ParsePlanRequest(text);
    ASSERT_FALSE(request.ok()) << text;
    EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(request.status().message()), HasSubstr(message)) << text;
  }
}

TEST(PlanJsonTest, WritesChunksWorkloadsAndNullForUnboundedRatios) {
  auto topology = Topology::Parse("g1n2");
  auto world = World::Create(*topology, 2);
  auto cost = CostModel::Create(1, 0.0);
  PlanRequest request;
  request.topology = "g1n2";
  request.d_model = 1;
  request.gamma = 0.0;
  request.ranks = {{7}, {}};
  auto plan = BalanceGreedy(*world, *cost, request.ranks);
  ASSERT_TRUE(plan.ok());
  const auto out = nlohmann::json::parse(PlanToJson(request, *plan, 2.0));
  ASSERT_EQ(out["chunks"].size(), 1u);
  EXPECT_EQ(out["chunks"][0]["src_rank"], 0);
  EXPECT_EQ(out["chunks"][0]["seq_index"], 0);
  EXPECT_EQ(out["chunks"][0]["offset"], 0);
  EXPECT_EQ(out["chunks"][0]["length"], 7);
  EXPECT_EQ(out["chunks"][0]["dst_rank"], 0);
  EXPECT_EQ(out["gpu_workload"], (std::vector<double>{24.0 * 7, 0.0}));
  EXPECT_TRUE(out["after"]["wir"].is_null());  // one GPU idle: max/min is unbounded
  EXPECT_DOUBLE_EQ(out["after"]["max_over_mean"].get<double>(), 2.0);
  EXPECT_EQ(out["moved_tokens"], 0);
  EXPECT_EQ(out["moved_bytes"], 0);
  EXPECT_EQ(out["total_tokens"], 7);

  const auto slice = nlohmann::json::parse(RankPlanToJson(plan->Slice(0)));
  EXPECT_EQ(slice["sends"][0]["dst_rank"], 0);
  EXPECT_EQ(slice["recvs"][0]["src_rank"], 0);
  EXPECT_EQ(slice["compute_chunk_lengths"], (std::vector<int64_t>{7}));
}

// "topology": "auto" answers with the layout chosen for the lengths: even
// lengths keep one-GPU bags, one sequence that outweighs the rest does not.
// "rank_speeds" plans by time: rank 1 at half speed holds half the work,
// and the figures are of time; bad speeds name the field.
TEST(PlanJsonTest, RankSpeedsPlanByTime) {
  const std::string request =
      R"({"topology": "g1n4", "d_model": 64, "gamma": 0,
          "ranks": [[100, 100, 100, 100, 100, 100], [100, 100, 100, 100, 100, 100], [], []],
          "rank_speeds": [1, 0.5, 1, 1]})";
  auto text = PlanRequestToJson(request, CostKind::kTransformer, BalancerOptions(), std::nullopt);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json plan = nlohmann::json::parse(*text);
  const std::vector<double> work = plan["gpu_workload"].get<std::vector<double>>();
  EXPECT_DOUBLE_EQ(work[1], work[0] / 2);  // 12 sequences: 4, 2, 3, 3 ... by time
  EXPECT_EQ(plan["rank_speeds"].size(), 4u);
  EXPECT_DOUBLE_EQ(plan["rank_speeds"][1].get<double>(), 0.5 / 0.875);
  EXPECT_LT(plan["after"]["max_over_mean"].get<double>(), 1.2);
  EXPECT_GE(plan["after"]["max_over_mean"].get<double>(),
            plan["lower_bound_max_over_mean"].get<double>() - 1e-12);
  for (const auto& [speeds, message] : std::vector<std::pair<std::string, std::string>>{
           {R"([1, "x", 1, 1])", "rank_speeds[1]: must be a number"},
           {R"([1, 1])", "rank_speeds: 2 speeds for a world of 4 ranks"},
           {R"(2)", "rank_speeds: must be an array of numbers"}}) {
    auto bad = ParsePlanRequest(
        absl::StrCat(R"({"topology": "g1n4", "ranks": [[1], [1], [1], [1]], "rank_speeds": )",
                     speeds, "}"));
    EXPECT_THAT(bad.status().message(), HasSubstr(message)) << speeds;
  }
}

TEST(PlanJsonTest, AutoAnswersTheChosenLayout) {
  const std::string even =
      R"({"topology": "auto", "d_model": 3072, "gamma": 0.49, "ranks": [[4096], [4096], [4096], )"
      R"([4096], [4096], [4096], [4096], [4096]]})";
  auto plan = PlanRequestToJson(even, CostKind::kTransformer, BalancerOptions(), std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(nlohmann::json::parse(*plan)["topology"], "g1n8");
  const std::string skewed =
      R"({"topology": "auto:max_bag=4", "d_model": 3072, "gamma": 0.49, "ranks": [[262144], )"
      R"([512], [512], [512], [512], [512], [512], [512]]})";
  plan = PlanRequestToJson(skewed, CostKind::kTransformer, BalancerOptions(), std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto out = nlohmann::json::parse(*plan);
  const std::string layout = out["topology"];
  EXPECT_NE(layout, "g1n8");
  EXPECT_THAT(layout, HasSubstr("g4n"));
  EXPECT_LT(out["after"]["max_over_mean"].get<double>(),
            out["before"]["max_over_mean"].get<double>());
  auto slice = PlanRequestToJson(skewed, CostKind::kTransformer, BalancerOptions(), 0);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(nlohmann::json::parse(*slice)["ulysses"]["gpus"], 4);
  // The request's machine: nodes of 2 GPUs allow no bag of 4.
  const std::string small_nodes =
      R"({"topology": "auto:max_bag=4", "d_model": 3072, "gamma": 0.49, )"
      R"("machine": {"gpus_per_node": 2, "inter_node_bytes_per_second": 25e9}, "ranks": [[262144], )"
      R"([512], [512], [512], [512], [512], [512], [512]]})";
  plan = PlanRequestToJson(small_nodes, CostKind::kTransformer, BalancerOptions(), std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(std::string(nlohmann::json::parse(*plan)["topology"]), HasSubstr("g2n"));
  EXPECT_THAT(std::string(nlohmann::json::parse(*plan)["topology"]), Not(HasSubstr("g4n")));
  auto bad = PlanRequestToJson(R"({"topology": "auto:max_bag=6", "ranks": [[1]]})",
                               CostKind::kTransformer, BalancerOptions(), std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("max_bag=6 is not a power of two"));
}

TEST(PlanJsonTest, MovedBytesAreMovedTokensTimesTokenBytes) {
  auto world = World::Create(*Topology::Parse("g1n2"), 2);
  auto cost = CostModel::Create(1, 0.0);
  PlanRequest request;
  request.topology = "g1n2";
  request.d_model = 1;
  request.gamma = 0.0;
  request.token_bytes = 10;
  // All 30 tokens sit on rank 0; balancing sends one of the two 15-token
  // sequences to rank 1.
  request.ranks = {{15, 15}, {}};
  auto plan = BalanceGreedy(*world, *cost, request.ranks);
  ASSERT_TRUE(plan.ok());
  const auto out = nlohmann::json::parse(PlanToJson(request, *plan, 1.0));
  EXPECT_EQ(out["moved_tokens"], 15);
  EXPECT_EQ(out["token_bytes"], 10);
  EXPECT_EQ(out["moved_bytes"], 150);
  EXPECT_EQ(plan->MovedBytes(0), 0);
  EXPECT_EQ(plan->MovedBytes(int64_t{1} << 62), INT64_MAX);  // saturates, never wraps
}

TEST(PlanJsonTest, ACostTableRoundTripsAndPlansWithTheMeasuredModel) {
  const MeasuredAttention attention = *MeasuredAttention::Create({100, 10000}, {1e6, 1e9}, "t");
  const std::string text = CostTableToJson(CostTable{64, 2e-12, 0.8, attention});
  auto table = ParseCostTable(text, "table.json");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->d_model, 64);
  EXPECT_EQ(table->k, 2e-12);
  EXPECT_EQ(table->gamma, 0.8);
  EXPECT_EQ(table->attention.pairs(), attention.pairs());
  EXPECT_EQ(table->attention.work(), attention.work());

  // The table in a plan request: the measured model prices the workloads.
  nlohmann::json request = {{"topology", "g1n2"}, {"d_model", 64}, {"ranks", {{100}, {10}}}};
  request["measured_attention"] = nlohmann::json::parse(text)["measured_attention"];
  auto plan = PlanRequestToJson(request.dump(), CostKind::kMeasured, BalancerOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto before = nlohmann::json::parse(*plan)["gpu_workload_before"];
  EXPECT_DOUBLE_EQ(before[0].get<double>(), 24.0 * 100 * 64 * 64 + 1e9);
  EXPECT_DOUBLE_EQ(before[1].get<double>(), 24.0 * 10 * 64 * 64 + 1e6);
  // Without it the measured model is refused, and with another model the table is.
  request.erase("measured_attention");
  EXPECT_THAT(std::string(PlanRequestToJson(request.dump(), CostKind::kMeasured, BalancerOptions())
                              .status()
                              .message()),
              HasSubstr("the measured cost model needs its table"));
  request["measured_attention"] = {{"pairs", {1}}, {"work", {1}}};
  EXPECT_THAT(std::string(PlanRequestToJson(request.dump(), CostKind::kTransformer,
                                            BalancerOptions())
                              .status()
                              .message()),
              HasSubstr("only for the measured cost model"));
  request["measured_attention"] = {{"pairs", {1, 2}}, {"work", {2, 1}}};
  EXPECT_THAT(std::string(ParsePlanRequest(request.dump()).status().message()),
              HasSubstr("measured_attention.work[1]: 1 is less than work[0] (2)"));
}

TEST(PlanJsonTest, ACostTableNamesItsFileAndField) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"[", "t.json: input: not valid JSON"},
           {R"({"cost_model": "transformer"})", "t.json: cost_model: must be \"measured\""},
           {R"({"cost_model": "measured", "d_model": 0})", "t.json: d_model: must be an integer"},
           {R"({"cost_model": "measured", "d_model": 8, "x": 1})", "t.json: x: unknown field"},
           {R"({"cost_model": "measured", "d_model": 8})", "t.json: measured_attention: missing"},
           {R"({"cost_model": "measured", "d_model": 8, "measured_attention": {"pairs": [1]}})",
            "t.json: measured_attention.work: missing"},
           {R"({"cost_model": "measured", "d_model": 8,
               "measured_attention": {"pairs": [1], "work": ["a"]}})",
            "t.json: measured_attention.work[0]: must be a number"},
       }) {
    auto table = ParseCostTable(text, "t.json");
    ASSERT_FALSE(table.ok()) << text;
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(message)) << text;
  }
}

TEST(PlanJsonTest, TheFlopModelsPredictTheStepOnTheRequestsMachine) {
  const std::string request = R"({"topology": "g2n1", "d_model": 1024, "ranks": [[8192], [64]],
                                  "machine": {"flops_per_second": 1e15}})";
  const auto plan =
      nlohmann::json::parse(*PlanRequestToJson(request, CostKind::kTransformer, BalancerOptions()));
  const auto& predicted = plan["predicted_step"];
  const double seconds = predicted["seconds"].get<double>();
  EXPECT_GT(predicted["ulysses_seconds"].get<double>(), 0.0);  // a 2-GPU bag
  EXPECT_NEAR(seconds,
              predicted["compute_seconds"].get<double>() +
                  predicted["ulysses_seconds"].get<double>() +
                  predicted["route_seconds"].get<double>(),
              1e-12 * seconds);
  // Compute alone: half the bag's work on a 1e15 FLOP/s GPU.
  const double work = plan["gpu_workload"][0].get<double>();
  EXPECT_NEAR(predicted["compute_seconds"].get<double>(), work / 1e15, 1e-9 * work / 1e15);
  const auto uniform =
      nlohmann::json::parse(*PlanRequestToJson(request, CostKind::kUniform, BalancerOptions()));
  EXPECT_FALSE(uniform.contains("predicted_step"));
}

}  // namespace
}  // namespace knapformer
