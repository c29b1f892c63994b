#include "planner/packing_bound.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/balance_stats.h"
#include "planner/cost_model.h"
#include "planner/topology.h"
#include "tests/planner/make_world.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::MakeWorld;

// The least busiest-bag workload of any placement of whole sequences into
// `bags` equal bags, by trying every one.
double BestBusiest(const std::vector<double>& items, int bags) {
  double best = 1e300;
  std::vector<double> load(bags, 0.0);
  std::function<void(size_t)> place = [&](size_t k) {
    if (k == items.size()) {
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (int b = 0; b < bags; ++b) {
      if (load[b] + items[k] >= best) continue;  // cannot beat the best found
      load[b] += items[k];
      place(k + 1);
      load[b] -= items[k];
      if (load[b] == 0) break;  // empty bags are all alike
    }
  };
  place(0);
  return best;
}

std::vector<double> Descending(std::vector<double> items) {
  std::sort(items.begin(), items.end(), std::greater<double>());
  return items;
}

TEST(PackingBoundTest, PigeonholeSeesTwoSequencesSharingABag) {
  // Four equal sequences in three bags: two share one.
  EXPECT_DOUBLE_EQ(UniformBagsLowerBound({10, 10, 10, 10}, 3, 1, 40.0 / 3), 20.0);
  // Two GPUs per bag share it.
  EXPECT_DOUBLE_EQ(UniformBagsLowerBound({10, 10, 10, 10}, 3, 2, 0), 10.0);
}

TEST(PackingBoundTest, L2SeesWhatNeitherTheMeanNorPigeonholeSees) {
  // 7, 7, 7, 4, 4, 1 in three bags: the mean is 10 and pigeonhole (the
  // third 7 with the 1) says 8. But every bag holds a 7 (two make 14), so a
  // 4 joins a 7 somewhere: the best is 11.
  const std::vector<double> odd = {7, 7, 7, 4, 4, 1};
  EXPECT_DOUBLE_EQ(BestBusiest(odd, 3), 11.0);
  const double bound = UniformBagsLowerBound(odd, 3, 1, 10.0);
  EXPECT_GT(bound, 10.5);  // L2 rules out every capacity below 11 it tries
  EXPECT_LE(bound, 11.0);
}

TEST(PackingBoundTest, EdgeCasesReturnWhatIsKnown) {
  EXPECT_DOUBLE_EQ(UniformBagsLowerBound({}, 4, 1, 3.0), 3.0);
  // More bags than sequences: each its own bag, the heaviest decides.
  EXPECT_DOUBLE_EQ(UniformBagsLowerBound({9, 2}, 5, 1, 9.0), 9.0);
  // A `known` below the heaviest sequence is raised to at least it.
  EXPECT_GE(UniformBagsLowerBound({9, 2}, 5, 1, 1.0), 9.0 * (1 - 1e-9));
}

TEST(PackingBoundTest, NeverAboveTheBestPackingOfRandomSequences) {
  uint64_t state = 12345;
  auto next = [&](int range) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((state >> 33) % range + 1);
  };
  int above_mean = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int bags = 2 + trial % 4;       // 2..5
    const int count = bags + trial % 6;   // up to 5 more than bags
    std::vector<double> items;
    for (int i = 0; i < count; ++i) items.push_back(next(trial % 2 ? 50 : 1000));
    items = Descending(items);
    double total = 0;
    for (double w : items) total += w;
    const double known = std::max(total / bags, items[0]);
    const double bound = UniformBagsLowerBound(items, bags, 1, known);
    const double best = BestBusiest(items, bags);
    ASSERT_LE(bound, best * (1 + 1e-12)) << "trial " << trial;
    ASSERT_GE(bound, known);
    // Bags of two GPUs share their bag's work: the bound is per GPU.
    ASSERT_LE(UniformBagsLowerBound(items, bags, 2, known / 2), best / 2 * (1 + 1e-12))
        << "trial " << trial;
    if (bound > known * (1 + 1e-9)) ++above_mean;
  }
  EXPECT_GT(above_mean, 40);  // the packing terms decide often
}

// L2 as Martello and Toth state it, every a in {0} and the workloads of at
// most C/2, every set counted by scanning: the bags `capacity` needs.
int64_t ReferenceL2(const std::vector<double>& items, double capacity) {
  if (items[0] > capacity) return static_cast<int64_t>(items.size()) + 1;
  double total = 0;
  for (double w : items) total += w;
  int64_t best = static_cast<int64_t>(std::ceil(total / capacity - 1e-9));
  std::vector<double> alphas = {0};
  for (double w : items) {
    if (w <= capacity / 2) alphas.push_back(w);
  }
  for (double a : alphas) {
    int64_t n1 = 0, n2 = 0;
    double s23 = 0;
    for (double w : items) {
      if (w > capacity - a) {
        ++n1;
      } else if (w > capacity / 2) {
        ++n2;
        s23 += w;
      } else if (w >= a) {
        s23 += w;
      }
    }
    best = std::max(best, n1 + std::max(n2, static_cast<int64_t>(
                                                std::ceil(s23 / capacity - 1e-9))));
  }
  return best;
}

// The same bisection as UniformBagsLowerBound, on ReferenceL2.
double ReferenceBound(const std::vector<double>& items, int bags, double known) {
  double bound = known;
  for (int k = 1; k * bags + 1 <= static_cast<int>(items.size()); ++k) {
    double together = 0;
    for (int j = k * bags - k; j <= k * bags; ++j) together += items[j];
    bound = std::max(bound, together);
  }
  double total = 0;
  for (double w : items) total += w;
  double lo = bound, hi = std::max(bound, total / bags + items[0]);
  for (int round = 0; round < 48 && lo < hi; ++round) {
    const double middle = lo + (hi - lo) / 2;
    if (ReferenceL2(items, middle) > bags) {
      lo = middle;
      bound = std::max(bound, middle);
    } else {
      hi = middle;
    }
  }
  return bound;
}

TEST(PackingBoundTest, EqualsMartelloAndTothsL2CountedByScanning) {
  uint64_t state = 777;
  auto next = [&](int range) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((state >> 33) % range + 1);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int bags = 2 + trial % 30;
    std::vector<double> items;
    const int count = bags * (1 + trial % 4) + trial % 7;
    for (int i = 0; i < count; ++i) items.push_back(next(trial % 3 ? 100 : 7));  // ties too
    items = Descending(items);
    double total = 0;
    for (double w : items) total += w;
    const double known = std::max(total / bags, items[0]);
    EXPECT_DOUBLE_EQ(UniformBagsLowerBound(items, bags, 1, known),
                     ReferenceBound(items, bags, known))
        << "trial " << trial;
  }
}

TEST(PackingBoundTest, MaxOverMeanLowerBoundUsesItForBagsOfOneSize) {
  const CostModel cost = *CostModel::Create(1, 0.0);  // workload = 24 * tokens
  // Four equal sequences on three GPUs: 2 / (4/3) = 1.5.
  EXPECT_DOUBLE_EQ(MaxOverMeanLowerBound(MakeWorld("g1n3", 3), cost, {{10, 10}, {10}, {10}}),
                   1.5);
  // Bags of different sizes: only the mean and the heaviest sequence.
  EXPECT_DOUBLE_EQ(
      MaxOverMeanLowerBound(MakeWorld("g1n1+g2n1", 3), cost, {{10, 10}, {10}, {10}}), 1.0);
}

}  // namespace
}  // namespace knapformer
