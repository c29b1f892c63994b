// The auto layout: its spec, its errors, and properties over thousands of
// random worlds (valid plans, bags aligned inside nodes, deterministic, never
// predicted slower than a fixed homogeneous layout), and the paper's three
// scenarios on 4 nodes of 8 GPUs.

#include "planner/auto_layout.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/data_stream.h"
#include "planner/masked_stream.h"
#include "planner/step_time.h"
#include "planner/validate.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(AutoLayoutSpecTest, ParsesDefaultsAndKeys) {
  auto plain = AutoLayout::Parse("auto");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->max_bag, 8);
  EXPECT_EQ(plain->group, 0);
  EXPECT_EQ(plain->spec(), "auto:max_bag=8");
  auto both = AutoLayout::Parse("auto:group=16:max_bag=4");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->max_bag, 4);
  EXPECT_EQ(both->group, 16);
  EXPECT_EQ(both->spec(), "auto:max_bag=4:group=16");
  EXPECT_TRUE(AutoLayout::Parse(both->spec()).ok());
  EXPECT_TRUE(AutoLayout::Matches("auto"));
  EXPECT_TRUE(AutoLayout::Matches("auto:max_bag=2"));
  EXPECT_FALSE(AutoLayout::Matches("autox"));
  EXPECT_FALSE(AutoLayout::Matches("g1n8"));
}

TEST(AutoLayoutSpecTest, RejectsBadSpecsNamingTheKey) {
  struct Bad {
    const char* spec;
    const char* message;
  };
  for (const Bad& bad : {Bad{"auto:max_bag=3", "max_bag=3 is not a power of two"},
                         Bad{"auto:max_bag=0", "max_bag=0 is not a power of two"},
                         Bad{"auto:group=0", "group=0 is outside [1, 1048576]"},
                         Bad{"auto:group=99999999", "group=99999999 is outside"},
                         Bad{"auto:max_bag=", "'max_bag=' is not key=<positive integer>"},
                         Bad{"auto:max_bag=+4", "is not key=<positive integer>"},
                         Bad{"auto:", "'' is not key=<positive integer>"},
                         Bad{"auto:max_bag=4:", "'' is not key=<positive integer>"},
                         Bad{"auto:bags=4", "unknown key 'bags'"},
                         Bad{"auto:max_bag=4:max_bag=2", "max_bag given twice"},
                         Bad{"g4n2", "not an auto layout"}}) {
    auto parsed = AutoLayout::Parse(bad.spec);
    ASSERT_FALSE(parsed.ok()) << bad.spec;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(bad.message)) << bad.spec;
  }
}

CommPrices Prices(const CostModel& cost, int32_t gpus_per_node = 8) {
  Machine machine;
  machine.gpus_per_node = gpus_per_node;
  return *CommPrices::Create(machine, cost);
}

TEST(BalanceAutoTest, RejectsWorldsThatAreNotWholeGroupsOrNodes) {
  const CostModel cost = *CostModel::Create(64, 1.0);
  const RankLengths twelve(12, std::vector<int64_t>{100});
  AutoLayout layout;
  layout.group = 8;
  auto not_groups = BalanceAuto(layout, 12, cost, Prices(cost), twelve);
  ASSERT_FALSE(not_groups.ok());
  EXPECT_THAT(std::string(not_groups.status().message()),
              HasSubstr("world_size: 12 is not a multiple of the group size 8"));
  layout.group = 12;
  auto not_nodes = BalanceAuto(layout, 12, cost, Prices(cost), twelve);
  ASSERT_FALSE(not_nodes.ok());
  EXPECT_THAT(std::string(not_nodes.status().message()),
              HasSubstr("a group of 12 GPUs is not a whole number of nodes of 8 GPUs"));
  auto lengths = BalanceAuto(AutoLayout(), 8, cost, Prices(cost), twelve);
  ASSERT_FALSE(lengths.ok());
  EXPECT_THAT(std::string(lengths.status().message()), HasSubstr("ranks: got sequence lengths"));
  auto linear = CommPrices::Create(Machine(), *CostModel::Create(64, 1.0, CostKind::kLinear));
  ASSERT_FALSE(linear.ok());
  EXPECT_THAT(std::string(linear.status().message()),
              HasSubstr("transformer and measured models, not linear"));
  Machine broken;
  broken.inter_node_bytes_per_second = 0;
  auto bad_machine = CommPrices::Create(broken, cost);
  ASSERT_FALSE(bad_machine.ok());
  EXPECT_THAT(std::string(bad_machine.status().message()),
              HasSubstr("machine.inter_node_bytes_per_second: 0 is outside [1, 1e+20]"));
}

// A group smaller than a node of 8 is one partial node: 6 GPUs take bags of
// at most 2 (the largest power of two dividing it).
TEST(BalanceAutoTest, PartialNodeKeepsBagsThatDivideIt) {
  const CostModel cost = *CostModel::Create(3072, 0.49);
  RankLengths lengths(6);
  lengths[0] = {200000};  // one long sequence wants the largest bag there is
  for (int r = 1; r < 6; ++r) lengths[r] = {300, 400};
  auto plan = BalanceAuto(AutoLayout(), 6, cost, Prices(cost), lengths);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int32_t gpus : plan->plan.bag_gpus) EXPECT_LE(gpus, 2);
  EXPECT_THAT(plan->plan.topology, HasSubstr("g2n"));
}

struct RandomWorld {
  int32_t gpus_per_node;
  AutoLayout layout;
  int32_t world_size;
  RankLengths lengths;
  int64_t cap;
};

RandomWorld MakeRandomWorld(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  RandomWorld w;
  w.gpus_per_node = 1 << pick(0, 3);
  const int32_t group = w.gpus_per_node * static_cast<int32_t>(pick(1, 4));
  w.layout.max_bag = 1 << pick(0, 4);
  w.layout.group = pick(0, 1) ? group : 0;
  w.world_size = group * (w.layout.group > 0 ? static_cast<int32_t>(pick(1, 3)) : 1);
  w.lengths.resize(w.world_size);
  const int max_sequences = static_cast<int>(pick(0, 8));
  for (auto& rank : w.lengths) {
    const int n = static_cast<int>(pick(0, max_sequences));
    for (int i = 0; i < n; ++i) {
      const int64_t kind = pick(0, 99);
      rank.push_back(kind < 8    ? 0
                     : kind < 25 ? pick(1, 10)
                     : kind < 90 ? pick(1, 20000)
                     : kind < 99 ? pick(20000, 300000)
                                 : pick(1, CostModel::kMaxLength));
    }
  }
  w.cap = pick(0, 9) == 0 ? pick(1, 400000) : 0;
  return w;
}

// The same plan, bit for bit, however many threads solve it: auto's
// candidates in waves (a wave may hold candidates the earlier ones bound
// out), and a world's replicas in BalanceGreedy. Past kParallelMinSequences,
// so that the threads are used.
// PredictStep against the model it documents (step_time.h), worked out
// from the plan's chunk table: each GPU's tokens, its bag's attention
// split evenly, Ulysses per token, and the route: tokens a source sends
// away (every chunk not kept on it) against its bag's tokens received per
// GPU, between nodes where the source's node is not the bag's or the bag
// spans nodes. Bags of mixed sizes, some spanning nodes, and sequences
// shorter than their bag.
TEST(PredictStepTest, MatchesTheModelWorkedOutFromTheChunks) {
  const CostModel cost = *CostModel::Create(1024, 1.0);
  std::mt19937_64 random(5);
  for (int32_t per_node : {1, 2, 4, 8}) {
    const CommPrices prices = Prices(cost, per_node);
    const World world = *World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 8);
    RankLengths lengths(8);
    for (std::vector<int64_t>& rank : lengths) {
      for (int i = 0; i < 3; ++i) rank.push_back(1 + static_cast<int64_t>(random() % 5000));
    }
    const absl::StatusOr<Plan> plan = BalanceGreedy(world, cost, lengths, BalancerOptions());
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int32_t bags = static_cast<int32_t>(plan->bag_gpus.size());
    auto node = [&](int32_t rank) { return rank / per_node; };
    auto crosses = [&](int32_t bag) {
      return node(plan->bag_first_rank[bag]) !=
             node(plan->bag_first_rank[bag] + plan->bag_gpus[bag] - 1);
    };
    std::vector<int32_t> bag_of_rank(8);
    for (int32_t b = 0; b < bags; ++b) {
      for (int32_t p = 0; p < plan->bag_gpus[b]; ++p) bag_of_rank[plan->bag_first_rank[b] + p] = b;
    }
    std::vector<int64_t> tokens(8, 0), out_intra(8, 0), out_inter(8, 0);
    std::vector<int64_t> in_intra(bags, 0), in_inter(bags, 0);
    std::vector<double> attention(bags, 0.0);
    for (const PlacedSequence& seq : plan->sequences) {
      if (seq.bag >= 0) attention[seq.bag] += cost.Attention(seq.length);
    }
    for (const Chunk& chunk : plan->chunks) {
      tokens[chunk.dst_rank] += chunk.length;
      if (chunk.src_rank == chunk.dst_rank) continue;
      const int32_t bag = bag_of_rank[chunk.dst_rank];
      const bool inter = node(chunk.src_rank) != node(plan->bag_first_rank[bag]) || crosses(bag);
      (inter ? out_inter : out_intra)[chunk.src_rank] += chunk.length;
      (inter ? in_inter : in_intra)[bag] += chunk.length;
    }
    double slowest = 0;
    for (int32_t gpu = 0; gpu < 8; ++gpu) {
      const int32_t bag = bag_of_rank[gpu];
      const double g = plan->bag_gpus[bag];
      const double time =
          cost.Linear(tokens[gpu]) + attention[bag] / g +
          prices.UlyssesPerToken(plan->bag_gpus[bag], crosses(bag)) * tokens[gpu] +
          prices.RoutePerToken(false) * std::max<double>(out_intra[gpu], in_intra[bag] / g) +
          prices.RoutePerToken(true) * std::max<double>(out_inter[gpu], in_inter[bag] / g);
      slowest = std::max(slowest, time);
    }
    const PredictedStep predicted = PredictStep(*plan, world, lengths, cost, prices);
    EXPECT_NEAR(predicted.time, slowest, slowest * 1e-12) << "gpus per node " << per_node;
  }
}

TEST(BalanceAutoTest, ThreadsChangeNothing) {
  const CostModel cost = *CostModel::Create(3072, 0.49);
  const CommPrices prices = Prices(cost);
  auto same = [](const Plan& a, const Plan& b) {
    if (a.topology != b.topology || a.chunks.size() != b.chunks.size() ||
        a.workload_after != b.workload_after) {
      return false;
    }
    for (size_t c = 0; c < a.chunks.size(); ++c) {
      const Chunk &x = a.chunks[c], &y = b.chunks[c];
      if (x.src_rank != y.src_rank || x.seq_index != y.seq_index || x.offset != y.offset ||
          x.length != y.length || x.dst_rank != y.dst_rank) {
        return false;
      }
    }
    return true;
  };
  const MaskedStream video = *MaskedStream::Create("video-blockcausal", 2048, 7);
  const MaskedStream::Step masked = video.Batch(0);
  const RankLengths plain = DataStream::Create(*ParseDataCodes(ScenarioCodes("joint")), 2048, 3)
                                ->Batch(0);
  int64_t sequences = 0;
  for (const auto& rank : masked.lengths) sequences += static_cast<int64_t>(rank.size());
  ASSERT_GE(sequences, internal::kParallelMinSequences);
  for (const int32_t group : {0, 256}) {
    for (const bool with_masks : {false, true}) {
      SCOPED_TRACE(absl::StrCat("group ", group, with_masks ? ", masked" : ", plain"));
      const RankLengths& lengths = with_masks ? masked.lengths : plain;
      const RankMasks* masks = with_masks ? &masked.masks : nullptr;
      AutoLayout layout;
      layout.group = group;
      BalancerOptions options;
      auto one = BalanceAuto(layout, 2048, cost, prices, lengths, options, masks);
      ASSERT_TRUE(one.ok()) << one.status();
      for (const int32_t threads : {2, 5}) {
        options.threads = threads;
        auto many = BalanceAuto(layout, 2048, cost, prices, lengths, options, masks);
        ASSERT_TRUE(many.ok()) << many.status();
        EXPECT_TRUE(same(one->plan, many->plan)) << threads << " threads";
        EXPECT_EQ(one->solved, many->solved);
        EXPECT_EQ(one->predicted.time, many->predicted.time);
      }
    }
  }
  const World replicas = *World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 2048);
  BalancerOptions options;
  auto one = BalanceGreedy(replicas, cost, masked.lengths, options, &masked.masks);
  ASSERT_TRUE(one.ok()) << one.status();
  options.threads = 3;
  auto many = BalanceGreedy(replicas, cost, masked.lengths, options, &masked.masks);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_TRUE(same(*one, *many));

  // Out of range: refused naming the field.
  for (const int32_t threads : {0, BalancerOptions::kMaxThreads + 1}) {
    options.threads = threads;
    auto refused = BalanceGreedy(replicas, cost, masked.lengths, options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("threads: ", threads)));
    auto refused_auto = BalanceAuto(AutoLayout(), 2048, cost, prices, plain, options);
    EXPECT_THAT(refused_auto.status().message(), HasSubstr("threads"));
  }
}

TEST(BalanceAutoPropertyTest, ValidAlignedDeterministicAndNeverSlowerThanHomogeneous) {
  std::mt19937_64 rng(20261123);
  constexpr int kCases = 2000;
  int mixed = 0, multi_gpu = 0, capped_out = 0, bounded_out = 0;
  for (int n = 0; n < kCases; ++n) {
    const RandomWorld w = MakeRandomWorld(rng);
    SCOPED_TRACE(absl::StrCat("case ", n, ": ", w.layout.spec(), " world ", w.world_size,
                              " node ", w.gpus_per_node, " cap ", w.cap));
    const CostModel cost = *CostModel::Create(n % 2 ? 3072 : 512, n % 3 ? 0.49 : 1.0);
    const CommPrices prices = Prices(cost, w.gpus_per_node);
    BalancerOptions options;
    options.max_tokens_per_gpu = w.cap;
    options.locality = n % 4 != 0;
    auto result = BalanceAuto(w.layout, w.world_size, cost, prices, w.lengths, options);

    const int32_t group = w.layout.group > 0 ? w.layout.group : w.world_size;
    const int32_t node = std::min(w.gpus_per_node, group);
    int32_t max_bag = 1;
    while (max_bag * 2 <= w.layout.max_bag && node % (max_bag * 2) == 0) max_bag *= 2;
    std::vector<std::string> homogeneous;
    for (int32_t g = 1; g <= max_bag; g *= 2) {
      homogeneous.push_back(absl::StrCat("g", g, "n", group / g));
    }
    if (!result.ok()) {
      // Only a cap refuses, and then every homogeneous layout refuses too.
      ASSERT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
      ++capped_out;
      for (const std::string& spec : homogeneous) {
        auto fixed = BalanceGreedy(*World::Create(*Topology::Parse(spec), w.world_size), cost,
                                   w.lengths, options);
        EXPECT_FALSE(fixed.ok()) << spec << " found a plan under the cap";
      }
      continue;
    }
    const Plan& plan = result->plan;
    ASSERT_TRUE(ValidatePlan(plan, result->world, w.lengths).ok())
        << ValidatePlan(plan, result->world, w.lengths);
    ASSERT_TRUE(ValidateSlices(plan, w.lengths).ok()) << ValidateSlices(plan, w.lengths);
    for (size_t b = 0; b < plan.bag_gpus.size(); ++b) {
      const int32_t gpus = plan.bag_gpus[b];
      const int32_t first = plan.bag_first_rank[b];
      ASSERT_TRUE(gpus >= 1 && (gpus & (gpus - 1)) == 0 && gpus <= max_bag) << "bag " << b;
      ASSERT_EQ(first % gpus, 0) << "bag " << b << " is not aligned";
      ASSERT_EQ(first / w.gpus_per_node, (first + gpus - 1) / w.gpus_per_node)
          << "bag " << b << " crosses a node";
      multi_gpu += gpus > 1;
    }
    mixed += !result->world.uniform() || result->world.spec().find('+') != std::string::npos;
    bounded_out += result->solved < result->candidates;
    if (w.cap > 0) {
      for (int64_t tokens : plan.TokensPerRank()) ASSERT_LE(tokens, w.cap);
    }
    const PredictedStep predicted = PredictStep(plan, result->world, w.lengths, cost, prices);
    ASSERT_EQ(predicted.time, result->predicted.time);
    ASSERT_EQ(predicted.slowest_rank, result->predicted.slowest_rank);
    ASSERT_EQ(predicted.max_compute, result->predicted.max_compute);

    auto again = BalanceAuto(w.layout, w.world_size, cost, prices, w.lengths, options);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->plan.topology, plan.topology);
    ASSERT_EQ(again->plan.chunks.size(), plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const Chunk& a = plan.chunks[i];
      const Chunk& b = again->plan.chunks[i];
      ASSERT_TRUE(a.src_rank == b.src_rank && a.seq_index == b.seq_index &&
                  a.offset == b.offset && a.length == b.length && a.dst_rank == b.dst_rank)
          << "chunk " << i << " differs between two runs";
    }

    for (const std::string& spec : homogeneous) {
      const World world = *World::Create(*Topology::Parse(spec), w.world_size);
      auto fixed = BalanceGreedy(world, cost, w.lengths, options);
      if (!fixed.ok()) continue;  // a cap only this layout cannot meet
      EXPECT_LE(result->predicted.time, PredictStep(*fixed, world, w.lengths, cost, prices).time)
          << "auto (" << plan.topology << ") is predicted slower than " << spec;
    }
  }
  // The generator reaches what it claims to cover.
  EXPECT_GT(mixed, kCases / 40);
  EXPECT_GT(multi_gpu, kCases / 4);
  EXPECT_GT(capped_out, 5);
  EXPECT_GT(bounded_out, kCases / 4);
}

double MeanPredicted(const std::string& scenario, const std::string& topology, int steps) {
  const CostModel cost = *CostModel::Create(3072, 0.49);
  const CommPrices prices = Prices(cost);
  DataStream stream = *DataStream::Create(*ParseDataCodes(ScenarioCodes(scenario)), 32, 7);
  double sum = 0;
  for (int step = 0; step < steps; ++step) {
    const RankLengths lengths = stream.Batch(step);
    if (AutoLayout::Matches(topology)) {
      auto plan = BalanceAuto(*AutoLayout::Parse(topology), 32, cost, prices, lengths);
      EXPECT_TRUE(plan.ok()) << plan.status();
      sum += plan->predicted.time;
    } else {
      const World world = *World::Create(*Topology::Parse(topology), 32);
      auto plan = BalanceGreedy(world, cost, lengths);
      EXPECT_TRUE(plan.ok()) << plan.status();
      sum += PredictStep(*plan, world, lengths, cost, prices).time;
    }
  }
  return sum / steps;
}

TEST(BalanceAutoTest, PaperScenariosNoSlowerThanTheBestFixedLayout) {
  for (const std::string& scenario : ScenarioNames()) {
    const double automatic = MeanPredicted(scenario, "auto", 5);
    double best = 0;
    for (const char* fixed : {"g1n32", "g2n16", "g4n8", "g8n4"}) {
      const double time = MeanPredicted(scenario, fixed, 5);
      if (best == 0 || time < best) best = time;
      EXPECT_LE(automatic, time) << scenario << ": auto against " << fixed;
    }
    std::cout << scenario << ": auto " << automatic << ", best fixed " << best << "\n";
  }
}

}  // namespace
}  // namespace knapformer
