// RepairToLimit on hand-worked placements. Workload = length throughout, so
// every figure can be checked by hand; bags of one GPU unless stated.

#include "planner/locality.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/sequence_table.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;

struct Seq {
  int64_t length;
  int32_t home;
  int32_t bag;
};

// A placement of sequences given heaviest first, as the balancer keeps them.
struct Placement {
  explicit Placement(const std::vector<Seq>& seqs) {
    for (const Seq& seq : seqs) {
      table.workload.push_back(static_cast<double>(seq.length));
      table.length.push_back(seq.length);
      table.id.push_back(table.size() - 1);
      table.home_bag.push_back(seq.home);
      bag.push_back(seq.bag);
    }
  }
  std::vector<double> Loads(int32_t num_bags) const {
    std::vector<double> loads(num_bags, 0.0);
    for (int32_t i = 0; i < table.size(); ++i) loads[bag[i]] += table.workload[i];
    return loads;
  }
  bool Repair(const std::vector<int32_t>& gpus, double limit, int32_t partners,
              int64_t max_tokens_per_gpu = 0) {
    assigned = Loads(static_cast<int32_t>(gpus.size()));
    return RepairToLimit(gpus, limit, max_tokens_per_gpu, partners, table, bag, assigned);
  }

  SequenceTable table;
  std::vector<int32_t> bag;
  std::vector<double> assigned;
};

TEST(RepairToLimitTest, TakesTheSwapThatAddsTheFewestMovedTokens) {
  // Limit 10. Bag 0 holds 6 + 5 = 11 of its own (excess 1); bag 1 holds its
  // own 3 and bag 0's 4 (room 3); bag 2 holds its own 8 (room 2). Actions
  // that end the excess, and the moved tokens they add:
  //   6 <-> 3: +6 +3 = 9    6 <-> 4: +6 -4 = 2
  //   5 <-> 3: +5 +3 = 8    5 <-> 4: +5 -4 = 1   (bag 2 offers none)
  // so 5 goes to bag 1 and bag 0's own 4 comes home.
  const std::vector<int32_t> gpus = {1, 1, 1};
  Placement p({{8, 2, 2}, {6, 0, 0}, {5, 0, 0}, {4, 0, 1}, {3, 1, 1}});
  ASSERT_TRUE(p.Repair(gpus, 10.0, 8));
  EXPECT_THAT(p.bag, ElementsAre(2, 0, 1, 0, 1));
  EXPECT_THAT(p.assigned, ElementsAre(10.0, 8.0, 8.0));
}

TEST(RepairToLimitTest, NeverTakesAnActionThatBreaksTheTokenCap) {
  // The first test's placement: its only actions put 8 or more tokens in bag
  // 1 (the cheapest, 5 <-> 4, leaves 3 + 5). A cap of 8 tokens per GPU
  // allows that one; a cap of 7 allows none, and the repair fails rather
  // than exceed it.
  const std::vector<int32_t> gpus = {1, 1, 1};
  const std::vector<Seq> start = {{8, 2, 2}, {6, 0, 0}, {5, 0, 0}, {4, 0, 1}, {3, 1, 1}};
  Placement eight(start);
  ASSERT_TRUE(eight.Repair(gpus, 10.0, 8, /*max_tokens_per_gpu=*/8));
  EXPECT_THAT(eight.bag, ElementsAre(2, 0, 1, 0, 1));
  Placement seven(start);
  EXPECT_FALSE(seven.Repair(gpus, 10.0, 8, /*max_tokens_per_gpu=*/7));
}

TEST(RepairToLimitTest, OnlyTriesTheBagsWithTheMostRoom) {
  // Limit 10; bag 0: 6 + 5 (excess 1). Bag 1 (7, room 3) has nothing that
  // fits: 6 and 5 do not fit its room, and no swap cuts 1 to 3. Bag 2 (4 + 4,
  // room 2) takes the 5 for a 4 (9 more tokens moved; the 6 for a 4 would be
  // 10). One partner (bag 1) is not enough, two are.
  const std::vector<int32_t> gpus = {1, 1, 1};
  const std::vector<Seq> start = {{7, 1, 1}, {6, 0, 0}, {5, 0, 0}, {4, 2, 2}, {4, 2, 2}};
  Placement one(start);
  EXPECT_FALSE(one.Repair(gpus, 10.0, 1));

  Placement two(start);
  ASSERT_TRUE(two.Repair(gpus, 10.0, 2));
  EXPECT_THAT(two.bag, ElementsAre(1, 0, 2, 2, 0));
  EXPECT_THAT(two.assigned, ElementsAre(10.0, 7.0, 9.0));
}

TEST(RepairToLimitTest, CutsAnExcessNoSingleActionEnds) {
  // Limit 11; bag 0 holds seven 2s (excess 3); bags 1 and 2 hold a 9 each
  // (room 2). No move or swap cuts 3 at once: one 2 goes to bag 1, then one
  // to bag 2.
  const std::vector<int32_t> gpus = {1, 1, 1};
  std::vector<Seq> seqs = {{9, 1, 1}, {9, 2, 2}};
  seqs.insert(seqs.end(), 7, Seq{2, 0, 0});
  Placement p(seqs);
  ASSERT_TRUE(p.Repair(gpus, 11.0, 8));
  EXPECT_THAT(p.assigned, ElementsAre(10.0, 11.0, 11.0));
  EXPECT_THAT(p.bag, ElementsAre(1, 2, 1, 2, 0, 0, 0, 0, 0));
}

TEST(RepairToLimitTest, FailsWhenNothingFitsAndLeavesALevelPlacementAlone) {
  const std::vector<int32_t> gpus = {1, 1};
  // One sequence above the limit on its own: nowhere to put it.
  Placement too_big({{12, 0, 0}, {2, 1, 1}});
  EXPECT_FALSE(too_big.Repair(gpus, 10.0, 8));

  // Nothing over the limit: nothing changes.
  Placement level({{9, 0, 1}, {8, 1, 0}});
  ASSERT_TRUE(level.Repair(gpus, 10.0, 8));
  EXPECT_THAT(level.bag, ElementsAre(1, 0));
}

TEST(RepairToLimitTest, RepairsTheWorstBagFirstAndThenUsesItAsAPartner) {
  // Limit 10. Bag 0 holds its own 7 + 5 (excess 2, repaired first); bag 1
  // its own 8 and bag 0's 3 (excess 1); bag 2 its own 2 (room 8).
  // Bag 0: moving its 5 to bag 2 adds 5 moved tokens, the least of any
  // action (the 7: 7; swaps with the 2: 9 and 7); bag 0 then has room 3 and
  // ranks first among partners (ties by bag id). Bag 1: bag 0's 3 goes
  // home, which takes 3 moved tokens away, and the search stops there.
  const std::vector<int32_t> gpus = {1, 1, 1};
  Placement p({{8, 1, 1}, {7, 0, 0}, {5, 0, 0}, {3, 0, 1}, {2, 2, 2}});
  ASSERT_TRUE(p.Repair(gpus, 10.0, 8));
  EXPECT_THAT(p.bag, ElementsAre(1, 0, 2, 0, 2));
  EXPECT_THAT(p.assigned, ElementsAre(10.0, 8.0, 7.0));
}

TEST(RepairToLimitTest, KeepsSequencesOutOfBagsWiderThanThem) {
  // Bags of 1 and 2 GPUs, limit 10 per GPU (10 and 20 in all). Bag 0 holds
  // 11 + 1 (excess 2); bag 1 holds 14 (room 6). The 1-token sequence cannot
  // go to 2 GPUs, the 11 can, and does; bag 1's 14 is too big to come back.
  const std::vector<int32_t> gpus = {1, 2};
  Placement stuck({{14, 1, 1}, {11, 0, 0}, {1, 0, 0}});
  EXPECT_FALSE(stuck.Repair(gpus, 10.0, 8));  // 11 exceeds bag 1's room

  Placement p({{10, 1, 1}, {6, 0, 0}, {5, 0, 0}, {1, 0, 0}});  // bag 0: 12; bag 1: 10 of 20
  ASSERT_TRUE(p.Repair(gpus, 10.0, 8));
  // Moving the 1 would not end the excess and may not go there anyway;
  // 6 and 5 both end it; 5 adds fewer moved tokens.
  EXPECT_THAT(p.bag, ElementsAre(1, 0, 1, 0));
  EXPECT_THAT(p.assigned, ElementsAre(7.0, 15.0));
}

}  // namespace
}  // namespace knapformer
