// RepairToLimit on hand-worked placements. Workload = length throughout, so
// every figure can be checked by hand; bags of one GPU unless stated.

#include "planner/locality.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;

// Heaviest first, as the balancer passes them.
LocalityItem Item(int64_t length, int32_t home, int32_t bag) {
  return LocalityItem{static_cast<double>(length), length, home, bag};
}

std::vector<double> Loads(const std::vector<LocalityItem>& items, int32_t num_bags) {
  std::vector<double> loads(num_bags, 0.0);
  for (const LocalityItem& item : items) loads[item.bag] += item.workload;
  return loads;
}

std::vector<int32_t> Bags(const std::vector<LocalityItem>& items) {
  std::vector<int32_t> bags;
  for (const LocalityItem& item : items) bags.push_back(item.bag);
  return bags;
}

TEST(RepairToLimitTest, TakesTheSwapThatAddsTheFewestMovedTokens) {
  // Limit 10. Bag 0 holds 6 + 5 = 11 of its own (excess 1); bag 1 holds its
  // own 3 and bag 0's 4 (room 3); bag 2 holds its own 8 (room 2). Actions
  // that end the excess, and the moved tokens they add:
  //   6 <-> 3: +6 +3 = 9    6 <-> 4: +6 -4 = 2
  //   5 <-> 3: +5 +3 = 8    5 <-> 4: +5 -4 = 1   (bag 2 offers none)
  // so 5 goes to bag 1 and bag 0's own 4 comes home.
  const std::vector<int32_t> gpus = {1, 1, 1};
  std::vector<LocalityItem> items = {Item(8, 2, 2), Item(6, 0, 0), Item(5, 0, 0),
                                     Item(4, 0, 1), Item(3, 1, 1)};
  std::vector<double> assigned = Loads(items, 3);
  ASSERT_TRUE(RepairToLimit(gpus, 10.0, 8, items, assigned));
  EXPECT_THAT(Bags(items), ElementsAre(2, 0, 1, 0, 1));
  EXPECT_THAT(assigned, ElementsAre(10.0, 8.0, 8.0));
}

TEST(RepairToLimitTest, OnlyTriesTheBagsWithTheMostRoom) {
  // Limit 10; bag 0: 6 + 5 (excess 1). Bag 1 (7, room 3) has nothing that
  // fits: 6 and 5 do not fit its room, and no swap cuts 1 to 3. Bag 2 (4 + 4,
  // room 2) takes the 5 for a 4 (9 more tokens moved; the 6 for a 4 would be
  // 10). One partner (bag 1) is not enough, two are.
  const std::vector<int32_t> gpus = {1, 1, 1};
  const std::vector<LocalityItem> start = {Item(7, 1, 1), Item(6, 0, 0), Item(5, 0, 0),
                                           Item(4, 2, 2), Item(4, 2, 2)};
  std::vector<LocalityItem> items = start;
  std::vector<double> assigned = Loads(items, 3);
  EXPECT_FALSE(RepairToLimit(gpus, 10.0, 1, items, assigned));

  items = start;
  assigned = Loads(items, 3);
  ASSERT_TRUE(RepairToLimit(gpus, 10.0, 2, items, assigned));
  EXPECT_THAT(Bags(items), ElementsAre(1, 0, 2, 2, 0));
  EXPECT_THAT(assigned, ElementsAre(10.0, 7.0, 9.0));
}

TEST(RepairToLimitTest, CutsAnExcessNoSingleActionEnds) {
  // Limit 11; bag 0 holds seven 2s (excess 3); bags 1 and 2 hold a 9 each
  // (room 2). No move or swap cuts 3 at once: one 2 goes to bag 1, then one
  // to bag 2.
  const std::vector<int32_t> gpus = {1, 1, 1};
  std::vector<LocalityItem> items = {Item(9, 1, 1), Item(9, 2, 2)};
  items.insert(items.end(), 7, Item(2, 0, 0));
  std::vector<double> assigned = Loads(items, 3);
  ASSERT_TRUE(RepairToLimit(gpus, 11.0, 8, items, assigned));
  EXPECT_THAT(assigned, ElementsAre(10.0, 11.0, 11.0));
  EXPECT_THAT(Bags(items), ElementsAre(1, 2, 1, 2, 0, 0, 0, 0, 0));
}

TEST(RepairToLimitTest, FailsWhenNothingFitsAndLeavesALevelPlacementAlone) {
  const std::vector<int32_t> gpus = {1, 1};
  // One sequence above the limit on its own: nowhere to put it.
  std::vector<LocalityItem> items = {Item(12, 0, 0), Item(2, 1, 1)};
  std::vector<double> assigned = Loads(items, 2);
  EXPECT_FALSE(RepairToLimit(gpus, 10.0, 8, items, assigned));

  // Nothing over the limit: nothing changes.
  items = {Item(9, 0, 1), Item(8, 1, 0)};
  assigned = Loads(items, 2);
  ASSERT_TRUE(RepairToLimit(gpus, 10.0, 8, items, assigned));
  EXPECT_THAT(Bags(items), ElementsAre(1, 0));
}

TEST(RepairToLimitTest, KeepsSequencesOutOfBagsWiderThanThem) {
  // Bags of 1 and 2 GPUs, limit 10 per GPU (10 and 20 in all). Bag 0 holds
  // 11 + 1 (excess 2); bag 1 holds 14 (room 6). The 1-token sequence cannot
  // go to 2 GPUs, the 11 can, and does; bag 1's 14 is too big to come back.
  const std::vector<int32_t> gpus = {1, 2};
  std::vector<LocalityItem> items = {Item(14, 1, 1), Item(11, 0, 0), Item(1, 0, 0)};
  std::vector<double> assigned = Loads(items, 2);
  EXPECT_FALSE(RepairToLimit(gpus, 10.0, 8, items, assigned));  // 11 exceeds bag 1's room

  items = {Item(10, 1, 1), Item(6, 0, 0), Item(5, 0, 0), Item(1, 0, 0)};
  assigned = Loads(items, 2);  // bag 0: 12, excess 2; bag 1: 10, room 10
  ASSERT_TRUE(RepairToLimit(gpus, 10.0, 8, items, assigned));
  // Moving the 1 would not end the excess and may not go there anyway;
  // 6 and 5 both end it; 5 adds fewer moved tokens.
  EXPECT_THAT(Bags(items), ElementsAre(1, 0, 1, 0));
  EXPECT_THAT(assigned, ElementsAre(7.0, 15.0));
}

}  // namespace
}  // namespace knapformer
