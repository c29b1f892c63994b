#include "planner/refine.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "planner/replica_bags.h"
#include "planner/sequence_table.h"

namespace knapformer {
namespace {

// Sequences of the given workloads (heaviest first, as packers hand them
// over), each long enough for any bag, ids in order.
SequenceTable TableOf(const std::vector<double>& workload) {
  SequenceTable table;
  table.workload = workload;
  for (size_t i = 0; i < workload.size(); ++i) {
    table.length.push_back(1024);
    table.id.push_back(static_cast<int32_t>(i));
    table.home_bag.push_back(0);
  }
  return table;
}

std::vector<double> AssignedOf(const SequenceTable& table, const std::vector<int32_t>& bag,
                               int32_t num_bags) {
  std::vector<double> assigned(num_bags, 0.0);
  for (int32_t i = 0; i < table.size(); ++i) assigned[bag[i]] += table.workload[i];
  return assigned;
}

TEST(RefineTest, MovesFromTheHeaviestBagToTheLightest) {
  // 6 + 2 | 1: moving the 2 levels them at 6 | 3.
  const ReplicaBags bags({1, 1});
  const SequenceTable table = TableOf({6, 2, 1});
  std::vector<int32_t> bag = {0, 0, 1};
  std::vector<double> assigned = AssignedOf(table, bag, 2);
  RefineBags(bags, 256, table, bag, assigned);
  EXPECT_EQ(bag, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(assigned, (std::vector<double>{6, 3}));
}

TEST(RefineTest, LevelsTheBagsBelowAStuckHeaviestWithTheLightest) {
  // Bag 0 holds one sequence of 10: no move or swap lowers it, so it is
  // stuck and the maximum is final. Bag 1 (6 + 1) then gives its 1 to the
  // lightest bag, 3 (1 + 1 = 2): the minimum rises, the maximum stays.
  const ReplicaBags bags({1, 1, 1, 1});
  const SequenceTable table = TableOf({10, 6, 3, 1, 1});
  std::vector<int32_t> bag = {0, 1, 2, 1, 3};
  std::vector<double> assigned = AssignedOf(table, bag, 4);
  RefineBags(bags, 256, table, bag, assigned);
  EXPECT_EQ(bag, (std::vector<int32_t>{0, 1, 2, 3, 3}));
  EXPECT_EQ(assigned, (std::vector<double>{10, 6, 3, 2}));
}

TEST(RefineTest, OnlyTheHeaviestBagTriesMorePartners) {
  // Bag 0 (one sequence of 11) is stuck. Bag 1 = 7 + 3 (10) gains nothing
  // with the least loaded bag 2 = 4 + 4 (8), but would with bag 3 = 6 + 2.5
  // (8.5): a swap to 9.5. The maximum (11) is final by then, so bag 1 tries
  // the least loaded bag alone, however many partners the heaviest may try,
  // and nothing moves.
  const ReplicaBags bags({1, 1, 1, 1});
  const SequenceTable table = TableOf({11, 7, 6, 4, 4, 3, 2.5});
  const std::vector<int32_t> before = {0, 1, 3, 2, 2, 1, 3};
  std::vector<int32_t> bag = before;
  std::vector<double> assigned = AssignedOf(table, bag, 4);
  RefineBags(bags, 256, table, bag, assigned, /*partners=*/4);
  EXPECT_EQ(bag, before);
  EXPECT_EQ(assigned, (std::vector<double>{11, 10, 8, 8.5}));
}

TEST(RefineTest, TheHeaviestBagTriesTheNextPartners) {
  // Bag 0 = 7 + 3 (10) gains nothing with the least loaded bag 1 = 4 + 4
  // (8): a move leaves 11 or more, a swap 7 <-> 4 gives 7 | 11. With bag
  // 2 = 6 + 2.5 (8.5), the second least loaded, a swap lowers it to 9.5.
  const ReplicaBags bags({1, 1, 1});
  const SequenceTable table = TableOf({7, 6, 4, 4, 3, 2.5});
  const std::vector<int32_t> before = {0, 2, 1, 1, 0, 2};
  std::vector<int32_t> bag = before;
  std::vector<double> assigned = AssignedOf(table, bag, 3);
  RefineBags(bags, 256, table, bag, assigned, /*partners=*/1);
  EXPECT_EQ(bag, before);

  RefineBags(bags, 256, table, bag, assigned, /*partners=*/2);
  EXPECT_LE(*std::max_element(assigned.begin(), assigned.end()), 9.5);
  EXPECT_EQ(assigned, AssignedOf(table, bag, 3));
}

TEST(RefineTest, OfEquallyLoadedBagsTheHighestIdIsTheHeaviest) {
  // Bags 0 (one sequence of 5) and 1 (3 + 2) tie at 5. Bag 1 counts as the
  // heaviest and gives its 2 to bag 2 (1 + 2 = 3); then bag 0 is the
  // heaviest, with nothing to gain, and bags 1 and 2 are level.
  const ReplicaBags bags({1, 1, 1});
  const SequenceTable table = TableOf({5, 3, 2, 1});
  std::vector<int32_t> bag = {0, 1, 1, 2};
  std::vector<double> assigned = AssignedOf(table, bag, 3);
  RefineBags(bags, 256, table, bag, assigned, /*partners=*/4);
  EXPECT_EQ(bag, (std::vector<int32_t>{0, 1, 2, 2}));
  EXPECT_EQ(assigned, (std::vector<double>{5, 3, 3}));
}

TEST(RefineTest, StopsAfterMaxRounds) {
  // 4 + 4 + 4 + 4 | 0.5 | 0 | 0: a round moves one 4 to the least loaded
  // bag, so one round leaves 12 | 0.5 | 4 | 0, and the rest level bag 0 at 4.
  const ReplicaBags bags({1, 1, 1, 1});
  const SequenceTable table = TableOf({4, 4, 4, 4, 0.5});
  std::vector<int32_t> bag = {0, 0, 0, 0, 1};
  std::vector<double> assigned = AssignedOf(table, bag, 4);
  RefineBags(bags, 1, table, bag, assigned);
  EXPECT_EQ(assigned[0], 12);
  RefineBags(bags, 256, table, bag, assigned);
  EXPECT_EQ(assigned[0], 4);
}

}  // namespace
}  // namespace knapformer
