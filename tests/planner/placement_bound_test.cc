// EveryPlacementSlower: each of its arguments on a replica built to need
// it, and on thousands of small random replicas never claiming more than
// the fastest of every placement (all of them predicted, PredictReplica).

#include "planner/placement_bound.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/step_time.h"

namespace knapformer {
namespace {

// One replica of `group` ranks: its sequences (one table in id order),
// the ranks' lengths and each sequence's rank.
struct Replica {
  RankLengths lengths;
  SequenceTable table;
  std::vector<int32_t> first_sequence;
};

Replica Make(const CostModel& cost, int32_t group, const std::vector<int64_t>& lengths,
             const std::vector<int32_t>& ranks) {
  Replica replica;
  replica.lengths.assign(group, {});
  for (size_t i = 0; i < lengths.size(); ++i) replica.lengths[ranks[i]].push_back(lengths[i]);
  replica.first_sequence.assign(group + 1, 0);
  for (int32_t rank = 0; rank < group; ++rank) {
    replica.first_sequence[rank + 1] =
        replica.first_sequence[rank] + static_cast<int32_t>(replica.lengths[rank].size());
    for (int64_t length : replica.lengths[rank]) {
      replica.table.workload.push_back(cost.Workload(length));
      replica.table.length.push_back(length);
    }
  }
  return replica;
}

// The least predicted time of any placement of the replica on `topology`.
double FastestPlacement(const Topology& topology, const Replica& replica, const CostModel& cost,
                        const CommPrices& prices, const std::vector<double>& speeds) {
  const int32_t n = replica.first_sequence.back();
  const int32_t bags = topology.num_bags();
  std::vector<int32_t> bag_of(n, 0);
  double fastest = std::numeric_limits<double>::infinity();
  for (;;) {
    fastest = std::min(fastest, PredictReplica(topology, 0, replica.lengths,
                                               replica.first_sequence, bag_of, cost, prices,
                                               nullptr, speeds)
                                    .time);
    int32_t i = 0;
    while (i < n && ++bag_of[i] == bags) bag_of[i++] = 0;
    if (i == n) return fastest;
  }
}

CommPrices Prices(const CostModel& cost, int32_t gpus_per_node,
                  double bytes_per_second = Machine().intra_node_bytes_per_second) {
  Machine machine;
  machine.gpus_per_node = gpus_per_node;
  machine.intra_node_bytes_per_second = bytes_per_second;
  machine.inter_node_bytes_per_second = bytes_per_second / 9;
  return *CommPrices::Create(machine, cost);
}

// Sequences of one length (one per rank), so that the time asked can be
// set against their workload w: attention-heavy, with Ulysses (on links
// 100x NVLink's) and the linear part each under 1% of w, and the
// arguments' thresholds (t, t / 2 per GPU of a bag) far from every sum.
class ArgumentTest : public ::testing::Test {
 protected:
  const CostModel cost_ = *CostModel::Create(64, 1.0);
  const CommPrices prices_ = Prices(cost_, 8, 100 * Machine().intra_node_bytes_per_second);
  static constexpr int64_t kLength = 65536;

  void SetUp() override {
    const double w = cost_.Workload(kLength);
    ASSERT_LT(prices_.UlyssesPerToken(8, false) * kLength, 0.01 * w);
    ASSERT_LT(cost_.Linear(kLength), 0.01 * w);
  }

  // Whether `count` such sequences on `spec` are proved slower than
  // w / `share` (each one `share` times the time asked), and checked
  // against every placement when so.
  bool Slower(const std::string& spec, int32_t count, double share) {
    const Topology topology = *Topology::Parse(spec);
    std::vector<int32_t> ranks(count);
    for (int32_t i = 0; i < count; ++i) ranks[i] = i % topology.group_size();
    const Replica replica =
        Make(cost_, topology.group_size(), std::vector<int64_t>(count, kLength), ranks);
    const double time = cost_.Workload(kLength) / share;
    const bool slower = EveryPlacementSlower(topology, replica.table, cost_, prices_, 1, time);
    if (slower) EXPECT_GT(FastestPlacement(topology, replica, cost_, prices_, {}), time) << spec;
    return slower;
  }
};

TEST_F(ArgumentTest, ASequenceTooSlowInEveryBagSize) {
  EXPECT_TRUE(Slower("g2n2", 1, 2.2));  // alone in 2 GPUs: 1.1 t
  EXPECT_FALSE(Slower("g2n2", 1, 1.9));
}

TEST_F(ArgumentTest, TwoBigSequencesInOneBag) {
  // Each over half of a 2-GPU bag's 2 t: three cannot share two bags.
  EXPECT_TRUE(Slower("g2n2", 3, 1.1));
  EXPECT_FALSE(Slower("g2n2", 2, 1.1));
}

TEST_F(ArgumentTest, VolumeOfSequencesThatMayUseNoSmallerBag) {
  // 1.5 t each: too slow on one GPU, not big in 4 (under 2 t). Three are
  // 4.5 t for the one 4-GPU bag's 4 t, though all eight GPUs hold 8 t.
  EXPECT_TRUE(Slower("g1n4+g4n1", 3, 1.5));
  EXPECT_FALSE(Slower("g1n4+g4n1", 2, 1.5));
}

TEST_F(ArgumentTest, BigSequencesSpillingIntoLargerBags) {
  // 1.4 t each: too slow on one GPU, fits 2 GPUs alone and is big there;
  // the one 2-GPU bag takes one, so three of four go to the 4-GPU bag:
  // 4.2 t for its 4 t. The 2- and 4-GPU bags together hold 6 t >= 5.6 t.
  EXPECT_TRUE(Slower("g1n2+g2n1+g4n1", 4, 1.4));
  EXPECT_FALSE(Slower("g1n2+g2n1+g4n1", 3, 1.4));
}

TEST(EveryPlacementSlowerTest, NotForATimeOfZeroOrNoSequences) {
  const CostModel cost = *CostModel::Create(64, 1.0);
  const CommPrices prices = Prices(cost, 8);
  const Topology topology = *Topology::Parse("g1n4");
  const Replica replica = Make(cost, 4, {100, 200}, {0, 1});
  EXPECT_FALSE(EveryPlacementSlower(topology, replica.table, cost, prices, 1, 0));
  EXPECT_FALSE(EveryPlacementSlower(topology, SequenceTable(), cost, prices, 1, 1e9));
}

// Random replicas of 4 and 8 GPUs (1, 2 or 4 a node), 1-6 sequences of
// 1-8192 tokens on random ranks, one speed or random ones: never slower
// than the fastest placement's time, and slower than some time below it
// often enough that the arguments are exercised.
TEST(EveryPlacementSlowerTest, NeverRulesOutTheFastestPlacement) {
  const CostModel cost = *CostModel::Create(64, 1.0);
  std::mt19937_64 rng(20261130);
  const std::vector<std::string> specs = {"g1n4",      "g2n2",           "g4n1",
                                          "g1n2+g2n1", "g1n4+g4n1",      "g2n2+g4n1",
                                          "g8n1",      "g1n2+g2n1+g4n1", "g4n2"};
  int32_t cases = 0, slower_below = 0;
  for (const std::string& spec : specs) {
    const Topology topology = *Topology::Parse(spec);
    const int32_t group = topology.group_size();
    for (int32_t trial = 0; trial < 120; ++trial) {
      const int32_t per_node = std::min<int32_t>(group, int32_t{1} << (rng() % 3));
      const CommPrices prices = Prices(cost, per_node);
      const int32_t n = 1 + static_cast<int32_t>(rng() % (topology.num_bags() > 3 ? 5 : 6));
      std::vector<int64_t> lengths(n);
      std::vector<int32_t> ranks(n);
      for (int32_t i = 0; i < n; ++i) {
        // Log-uniform: a few long sequences among short ones.
        lengths[i] = static_cast<int64_t>(std::exp2(static_cast<double>(rng() % 1300) / 100));
        ranks[i] = static_cast<int32_t>(rng() % group);
      }
      std::vector<double> speeds;
      double fastest = 1;
      if (trial % 3 == 2) {
        for (int32_t r = 0; r < group; ++r) speeds.push_back(0.5 + (rng() % 1000) / 1000.0);
        fastest = *std::max_element(speeds.begin(), speeds.end());
      }
      const Replica replica = Make(cost, group, lengths, ranks);
      const double best = FastestPlacement(topology, replica, cost, prices, speeds);
      ++cases;
      ASSERT_FALSE(EveryPlacementSlower(topology, replica.table, cost, prices, fastest, best))
          << spec << " case " << trial;
      ASSERT_FALSE(
          EveryPlacementSlower(topology, replica.table, cost, prices, fastest, best * 1.5))
          << spec << " case " << trial;
      slower_below +=
          EveryPlacementSlower(topology, replica.table, cost, prices, fastest, best * 0.9);
    }
  }
  EXPECT_GT(slower_below, cases / 10) << "of " << cases;
}

}  // namespace
}  // namespace knapformer
