// MinTree against a scan of every key: the least key and, of equal keys,
// the lowest index, through random changes (keys only grow, as a packing's
// loads do, and some jump to +inf, as a parked bag's key does), for every
// size up to 70 and a few around powers of two.

#include "planner/min_tree.h"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace internal {
namespace {

int32_t ScanArgMin(const std::vector<double>& keys) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(keys.size()); ++i) {
    if (keys[i] < keys[best]) best = i;
  }
  return best;
}

TEST(MinTreeTest, LeastKeyAndLowestIndexOfTiesThroughChanges) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> sizes;
  for (int32_t n = 1; n <= 70; ++n) sizes.push_back(n);
  for (int32_t n : {255, 256, 257, 1023, 1025}) sizes.push_back(n);
  for (int32_t n : sizes) {
    // Few distinct values: ties are the common case.
    std::vector<double> keys(n);
    for (double& key : keys) key = static_cast<double>(rng() % 4);
    MinTree tree(keys);
    ASSERT_EQ(tree.ArgMin(), ScanArgMin(keys)) << n;
    for (int32_t change = 0; change < 4 * n + 50; ++change) {
      // Mostly the minimum grows (the greedy's change), else any key.
      const int32_t i = rng() % 3 ? tree.ArgMin() : static_cast<int32_t>(rng() % n);
      keys[i] = rng() % 64 == 0 ? std::numeric_limits<double>::infinity()
                                : keys[i] + static_cast<double>(rng() % 3);
      tree.Set(i, keys[i]);
      ASSERT_EQ(tree.ArgMin(), ScanArgMin(keys)) << n << " change " << change;
      ASSERT_EQ(tree.MinKey(), keys[ScanArgMin(keys)]) << n << " change " << change;
    }
  }
}

}  // namespace
}  // namespace internal
}  // namespace knapformer
