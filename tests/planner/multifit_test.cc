#include "planner/multifit.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

double MaxOf(const std::vector<double>& assigned, const std::vector<int32_t>& gpus) {
  double worst = 0;
  for (size_t b = 0; b < assigned.size(); ++b) worst = std::max(worst, assigned[b] / gpus[b]);
  return worst;
}

TEST(MultifitTest, LevelsWhatTheLeastLoadedRuleLeavesApart) {
  // LPT puts 3 | 3, then 2, 2, 2 on the least loaded bag: 7 against 5.
  // Two bags of 6 exist: 3 + 3 and 2 + 2 + 2.
  const std::vector<int32_t> gpus = {1, 1};
  const std::vector<double> workload = {3, 3, 2, 2, 2};
  const std::vector<int32_t> first(5, 0), last(5, 1);
  std::vector<int32_t> bags;
  std::vector<double> assigned;
  ASSERT_TRUE(Multifit(gpus, workload, first, last, 6.0, 7.0, 16, 0.0, bags, assigned));
  EXPECT_DOUBLE_EQ(MaxOf(assigned, gpus), 6.0);
  std::vector<double> sums(2, 0.0);
  for (size_t k = 0; k < workload.size(); ++k) {
    ASSERT_GE(bags[k], 0);
    sums[bags[k]] += workload[k];
  }
  EXPECT_EQ(sums, assigned);
}

TEST(MultifitTest, NoCapacityFitsLeavesTheOutputAlone) {
  const std::vector<int32_t> gpus = {1, 1};
  const std::vector<double> workload = {5, 1};
  const std::vector<int32_t> first(2, 0), last(2, 1);
  std::vector<int32_t> bags = {7, 7};
  std::vector<double> assigned = {9};
  // Every capacity tried is below the heaviest sequence.
  EXPECT_FALSE(Multifit(gpus, workload, first, last, 3.0, 4.0, 16, 0.0, bags, assigned));
  EXPECT_EQ(bags, (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(assigned, (std::vector<double>{9}));
  EXPECT_FALSE(Multifit(gpus, workload, first, last, 4.0, 4.0, 16, 0.0, bags, assigned));
}

TEST(MultifitTest, AMinimumGainGivesUpAfterOnePackingOrFindsTheSamePacking) {
  // 3 + 3 | 2 + 2 + 2 packs at 6: from hi 6.3, a gain of 4% is there (6.3 /
  // 1.04 > 6), one of 10% is not (6.3 / 1.1 < 6: every sequence would have
  // to fit bags of 5.73).
  const std::vector<int32_t> gpus = {1, 1};
  const std::vector<double> workload = {3, 3, 2, 2, 2};
  const std::vector<int32_t> first(5, 0), last(5, 1);
  std::vector<int32_t> bags = {7}, plain_bags;
  std::vector<double> assigned = {9}, plain_assigned;
  EXPECT_FALSE(Multifit(gpus, workload, first, last, 5.0, 6.3, 16, 0.10, bags, assigned));
  EXPECT_EQ(bags, (std::vector<int32_t>{7}));
  EXPECT_EQ(assigned, (std::vector<double>{9}));
  ASSERT_TRUE(Multifit(gpus, workload, first, last, 5.0, 6.3, 16, 0.04, bags, assigned));
  ASSERT_TRUE(
      Multifit(gpus, workload, first, last, 5.0, 6.3, 16, 0.0, plain_bags, plain_assigned));
  EXPECT_EQ(bags, plain_bags);
  EXPECT_EQ(assigned, plain_assigned);
  EXPECT_DOUBLE_EQ(MaxOf(assigned, gpus), 6.0);
}

TEST(MultifitTest, SequencesStayInTheirUsableBagsAndShareBigBagsPerGpu) {
  // Bags of 1, 1 and 2 GPUs; sequence 0 may only use the 2-GPU bag.
  const std::vector<int32_t> gpus = {1, 1, 2};
  const std::vector<double> workload = {8, 4, 4, 2, 2};
  const std::vector<int32_t> first = {2, 0, 0, 0, 0}, last = {2, 2, 2, 2, 2};
  std::vector<int32_t> bags;
  std::vector<double> assigned;
  ASSERT_TRUE(Multifit(gpus, workload, first, last, 5.0, 10.0, 20, 0.0, bags, assigned));
  EXPECT_EQ(bags[0], 2);
  for (size_t k = 0; k < workload.size(); ++k) {
    EXPECT_GE(bags[k], first[k]);
    EXPECT_LE(bags[k], last[k]);
  }
  // 20 over 4 GPUs is 5 each, but no placement reaches it: the 2-GPU bag
  // holds 8 (4 per GPU) or 8 + 2 (5), and then 4, 4, 2 (or 4, 4, 2, 2) on two
  // single GPUs put 6 on one. 6 is the best, and MULTIFIT finds it.
  EXPECT_DOUBLE_EQ(MaxOf(assigned, gpus), 6.0);
}

TEST(MultifitTest, RenumberingKeepsLoadsAndGivesBagsTheirOwnSequences) {
  // Packed bag 0 holds rank 1's sequences, packed bag 1 rank 0's; bag 2 has
  // 2 GPUs and may only trade with bags of its size.
  const std::vector<int32_t> gpus = {1, 1, 2};
  const std::vector<int64_t> length = {100, 50, 70, 10};
  const std::vector<int32_t> home = {1, 1, 0, 2};
  std::vector<int32_t> bags = {0, 0, 1, 2};
  std::vector<double> assigned = {150, 70, 10};
  RenumberTowardHomes(gpus, length, home, bags, assigned);
  EXPECT_EQ(bags, (std::vector<int32_t>{1, 1, 0, 2}));
  EXPECT_EQ(assigned, (std::vector<double>{70, 150, 10}));
}

TEST(MultifitTest, RenumberingNeverCrossesBagSizes) {
  // Sequence 0 lives in the 2-GPU bag but was packed into a 1-GPU bag.
  const std::vector<int32_t> gpus = {1, 2};
  const std::vector<int64_t> length = {100, 5};
  const std::vector<int32_t> home = {1, 0};
  std::vector<int32_t> bags = {0, 1};
  std::vector<double> assigned = {100, 5};
  RenumberTowardHomes(gpus, length, home, bags, assigned);
  EXPECT_EQ(bags, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(assigned, (std::vector<double>{100, 5}));
}

TEST(MultifitTest, RenumberingSkipsTakenBagsWhenTwoWantTheSameHome) {
  // Packed bags 0 and 1 both hold rank 2's tokens: bag 0 (more of them)
  // gets number 2; bag 2 holds rank 0's and gets 0; bag 1 loses to bag 0
  // and takes the number left, 1, past the taken 0.
  const std::vector<int32_t> gpus = {1, 1, 1};
  const std::vector<int64_t> length = {90, 40, 5};
  const std::vector<int32_t> home = {2, 2, 0};
  std::vector<int32_t> bags = {0, 1, 2};
  std::vector<double> assigned = {90, 40, 5};
  RenumberTowardHomes(gpus, length, home, bags, assigned);
  EXPECT_EQ(bags, (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(assigned, (std::vector<double>{5, 40, 90}));
}

TEST(MultifitTest, RandomPackingsAreCompleteAndWithinTheCapacityFound) {
  uint64_t state = 99;
  auto next = [&](int range) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int32_t>((state >> 33) % range);
  };
  for (int trial = 0; trial < 200; ++trial) {
    // Bags of 1, 2 and 4 GPUs, ascending; each sequence a random run of them.
    std::vector<int32_t> gpus;
    for (int32_t size : {1, 2, 4}) {
      for (int32_t i = 1 + next(4); i > 0; --i) gpus.push_back(size);
    }
    const int32_t num_bags = static_cast<int32_t>(gpus.size());
    std::vector<double> workload;
    for (int i = 3 + next(40); i > 0; --i) workload.push_back(1 + next(1000));
    std::sort(workload.begin(), workload.end(), std::greater<double>());
    std::vector<int32_t> first(workload.size()), last(workload.size());
    double total = 0;
    for (size_t k = 0; k < workload.size(); ++k) {
      first[k] = next(num_bags);
      last[k] = first[k] + next(num_bags - first[k]);
      total += workload[k];
    }
    std::vector<int32_t> bags;
    std::vector<double> assigned;
    if (!Multifit(gpus, workload, first, last, 0.0, total, 24, 0.0, bags, assigned)) continue;
    std::vector<double> sums(num_bags, 0.0);
    for (size_t k = 0; k < workload.size(); ++k) {
      ASSERT_GE(bags[k], first[k]) << "trial " << trial;
      ASSERT_LE(bags[k], last[k]) << "trial " << trial;
      sums[bags[k]] += workload[k];
    }
    for (int32_t b = 0; b < num_bags; ++b) ASSERT_DOUBLE_EQ(sums[b], assigned[b]);
    // Renumbering keeps every load, moved whole to a bag of the same size.
    std::vector<int32_t> home(workload.size());
    std::vector<int64_t> length(workload.size());
    for (size_t k = 0; k < workload.size(); ++k) {
      home[k] = next(num_bags);
      length[k] = 1 + next(100);
    }
    std::vector<int32_t> renumbered = bags;
    std::vector<double> renumbered_assigned = assigned;
    RenumberTowardHomes(gpus, length, home, renumbered, renumbered_assigned);
    std::vector<int32_t> image(num_bags, -1);
    for (size_t k = 0; k < workload.size(); ++k) {
      ASSERT_EQ(gpus[renumbered[k]], gpus[bags[k]]);
      if (image[bags[k]] < 0) image[bags[k]] = renumbered[k];
      ASSERT_EQ(image[bags[k]], renumbered[k]);  // a packed bag moves whole
      ASSERT_DOUBLE_EQ(renumbered_assigned[renumbered[k]], assigned[bags[k]]);
    }
  }
}

// First-fit decreasing at `capacity`, bag by bag from each sequence's
// first usable one: the packing Multifit's first fit must give.
bool PlainFirstFit(const ReplicaBags& replica, const std::vector<double>& workload,
                   const std::vector<int32_t>& first, const std::vector<int32_t>& last,
                   double capacity, std::vector<int32_t>& bags, std::vector<double>& loads) {
  std::vector<double> room(replica.size());
  for (int32_t b = 0; b < replica.size(); ++b) room[b] = capacity * replica.speed[b];
  bags.assign(workload.size(), -1);
  loads.assign(replica.size(), 0.0);
  for (size_t k = 0; k < workload.size(); ++k) {
    int32_t b = first[k];
    while (b <= last[k] && room[b] < workload[k]) ++b;
    if (b > last[k]) return false;
    bags[k] = b;
    loads[b] += workload[k];
    room[b] -= workload[k];
  }
  return true;
}

TEST(MultifitTest, EverySequenceGoesToTheFirstUsableBagWithRoom) {
  // First-fit decreasing, replayed: at the one capacity tried (one round:
  // the middle of [lo, hi]), sequence k must be in the first bag of
  // [first[k], last[k]] with room for it then. Bag counts around the
  // search tree's fan-out and its powers, where its padding starts.
  uint64_t state = 7;
  auto next = [&](int range) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int32_t>((state >> 33) % range);
  };
  int packed = 0;
  for (int32_t num_bags : {1, 7, 8, 9, 63, 64, 65, 511, 512, 513, 4097}) {
    for (int trial = 0; trial < 4; ++trial) {
      const std::vector<int32_t> gpus(num_bags, 1);
      std::vector<double> workload;
      for (int32_t i = 3 * num_bags; i > 0; --i) workload.push_back(1 + next(1000));
      std::sort(workload.begin(), workload.end(), std::greater<double>());
      std::vector<int32_t> first(workload.size()), last(workload.size());
      double total = 0;
      for (size_t k = 0; k < workload.size(); ++k) {
        // Mostly every bag; some from a later bag, some short of the last
        // (first fit fills from the left: the right half keeps room).
        first[k] = next(4) == 0 ? next(num_bags) : 0;
        const int32_t rest = num_bags - first[k];
        last[k] = next(4) == 0 ? first[k] + rest / 2 + next(rest - rest / 2) : num_bags - 1;
        total += workload[k];
      }
      const double capacity = 2 * total / num_bags + 1000;
      std::vector<int32_t> bags;
      std::vector<double> assigned;
      // lo = hi = capacity: the one round tries exactly it.
      if (!Multifit(gpus, workload, first, last, capacity, capacity * (1 + 1e-3), 1, 0.0, bags,
                    assigned)) {
        continue;
      }
      ++packed;
      const double tried = capacity + capacity * 1e-3 / 2;
      std::vector<int32_t> expected;
      std::vector<double> expected_loads;
      ASSERT_TRUE(PlainFirstFit(gpus, workload, first, last, tried, expected, expected_loads));
      for (size_t k = 0; k < workload.size(); ++k) {
        ASSERT_EQ(bags[k], expected[k])
            << num_bags << " bags, trial " << trial << ", sequence " << k;
      }
    }
  }
  EXPECT_GE(packed, 40);  // of 44: the check above must have run
}

// The bisection as Multifit documents it, every capacity packed whole by a
// plain first fit: what Multifit must return, though it stops a packing
// once the rest surely fits and packs only the least capacity that did.
bool WholePackingsBisection(const ReplicaBags& replica, const std::vector<double>& workload,
                            const std::vector<int32_t>& first, const std::vector<int32_t>& last,
                            double lo, double hi, int32_t rounds, double min_gain,
                            std::vector<int32_t>& bags, std::vector<double>& assigned) {
  std::vector<int32_t> trial;
  std::vector<double> trial_loads;
  if (min_gain > 0 &&
      !PlainFirstFit(replica, workload, first, last, hi / (1 + min_gain), trial, trial_loads)) {
    return false;
  }
  bool found = false;
  for (int32_t round = 0; round < rounds && hi - lo > hi * 1e-4; ++round) {
    const double capacity = lo + (hi - lo) / 2;
    if (PlainFirstFit(replica, workload, first, last, capacity, trial, trial_loads)) {
      bags = trial;
      assigned = trial_loads;
      found = true;
      hi = capacity;
    } else {
      lo = capacity;
    }
  }
  return found;
}

TEST(MultifitTest, FindsThePackingWholePackingsWouldFind) {
  // Hundreds to thousands of sequences, so that Multifit's check that the
  // rest surely fits (every 64 sequences) runs many times a packing: heavy
  // sequences restricted to the larger bags (as the packer restricts
  // them), in some trials a few to a run short of the last bag, at one
  // speed or unequal ones, from a loose lower bound or a tighter one.
  std::mt19937_64 random(2024);
  auto next = [&](int range) { return static_cast<int32_t>(random() % range); };
  int found = 0;
  for (int trial = 0; trial < 120; ++trial) {
    std::vector<int32_t> gpus;
    for (int32_t size : {1, 2, 4, 8}) {
      for (int32_t i = next(40); i > 0; --i) gpus.push_back(size);
    }
    if (gpus.empty()) gpus.push_back(1);
    const int32_t num_bags = static_cast<int32_t>(gpus.size());
    std::vector<double> speeds(gpus.begin(), gpus.end());
    if (trial % 3 == 0) {
      for (int32_t b = 0; b < num_bags; ++b) speeds[b] *= 0.5 + next(100) / 100.0;
    }
    const ReplicaBags replica(gpus, speeds);
    std::vector<double> workload;
    for (int i = 64 + next(30 * num_bags); i > 0; --i) {
      // Many light sequences, a few up to 50 times heavier.
      workload.push_back(next(8) == 0 ? 1 + next(5000) : 1 + next(100));
    }
    std::sort(workload.begin(), workload.end(), std::greater<double>());
    std::vector<int32_t> first(workload.size()), last(workload.size());
    double total = 0, speed = 0;
    for (double s : speeds) speed += s;
    for (size_t k = 0; k < workload.size(); ++k) {
      // The heavier, the larger the smallest bag it may use.
      const int32_t need = workload[k] > 2500 ? 8 : workload[k] > 1000 ? 4 : 1;
      first[k] = static_cast<int32_t>(std::lower_bound(gpus.begin(), gpus.end(), need) -
                                      gpus.begin());
      if (first[k] == num_bags) first[k] = 0;
      const int32_t rest = num_bags - first[k];
      last[k] = trial % 5 == 1 && need == 1 && next(50) == 0
                    ? first[k] + rest / 2 + next(rest - rest / 2)
                    : num_bags - 1;
      total += workload[k];
    }
    const double mean = total / speed;
    const double lo = trial % 2 == 0 ? mean : 1.02 * mean;
    const double hi = (1.1 + next(40) / 100.0) * mean;
    const double min_gain = trial % 4 == 0 ? 0.0 : 1e-3;
    std::vector<int32_t> bags = {-2}, expected_bags = {-2};
    std::vector<double> assigned = {-2}, expected_assigned = {-2};
    const bool packed =
        Multifit(replica, workload, first, last, lo, hi, 16, min_gain, bags, assigned);
    const bool expected = WholePackingsBisection(replica, workload, first, last, lo, hi, 16,
                                                 min_gain, expected_bags, expected_assigned);
    ASSERT_EQ(packed, expected) << "trial " << trial;
    ASSERT_EQ(bags, expected_bags) << "trial " << trial;
    ASSERT_EQ(assigned, expected_assigned) << "trial " << trial;
    found += packed;
  }
  EXPECT_GE(found, 30);  // the comparison above must have covered packings
}

TEST(MultifitTest, ASequenceNoBagHasRoomForFailsThoughTheTotalWouldFit) {
  // 64 bags; 65 sequences of 60 and 1000 of 1. Below a capacity of 120 no
  // bag holds two of the 60s, so first fit fails on the 65th, though the
  // total (4900) is far under 64 bags of 100: a packing stopped early on
  // the total alone would say it fits. The bisection must end at 120.
  const std::vector<int32_t> gpus(64, 1);
  std::vector<double> workload(65, 60.0);
  workload.resize(65 + 1000, 1.0);
  const std::vector<int32_t> first(workload.size(), 0), last(workload.size(), 63);
  std::vector<int32_t> bags, expected_bags;
  std::vector<double> assigned, expected_assigned;
  ASSERT_TRUE(Multifit(gpus, workload, first, last, 90.0, 130.0, 16, 0.0, bags, assigned));
  ASSERT_TRUE(WholePackingsBisection(gpus, workload, first, last, 90.0, 130.0, 16, 0.0,
                                     expected_bags, expected_assigned));
  EXPECT_EQ(bags, expected_bags);
  EXPECT_EQ(assigned, expected_assigned);
  EXPECT_GE(*std::max_element(assigned.begin(), assigned.end()), 120.0);
}

TEST(MultifitTest, FillsEachBagToItsSpeedsCapacity) {
  // One GPU at 0.5, two at 1. The least loaded rule hands the 4 to bag 0,
  // the slow one (time 8); the best is 6 (at most a 2 on the slow GPU, 4 + 2
  // and 2 + 2 on the others, or nothing and 4 + 2, 2 + 2 + 2).
  const ReplicaBags replica({1, 1, 1}, {0.5, 1, 1});
  const std::vector<double> workload = {4, 2, 2, 2, 2};
  const std::vector<int32_t> first(5, 0), last(5, 2);
  std::vector<int32_t> bags;
  std::vector<double> assigned;
  ASSERT_TRUE(Multifit(replica, workload, first, last, 12.0 / 2.5, 8.0, 20, 0.0, bags, assigned));
  double worst = 0;
  for (int32_t b = 0; b < 3; ++b) worst = std::max(worst, replica.Time(b, assigned[b]));
  EXPECT_DOUBLE_EQ(worst, 6.0);
  EXPECT_NE(bags[0], 0);
}

TEST(MultifitTest, RenumberingOnlyTradesBagsOfOneSizeAndSpeed) {
  // Bags 0 and 1 are one size but not one speed: the packing stays as it
  // is, though each holds the other's home sequences. Bags 2 and 3 trade.
  const ReplicaBags replica({1, 1, 1, 1}, {0.5, 1, 1, 1});
  const std::vector<int64_t> length = {100, 50, 70, 60};
  const std::vector<int32_t> home = {1, 0, 3, 2};
  std::vector<int32_t> bags = {0, 1, 2, 3};
  std::vector<double> assigned = {100, 50, 70, 60};
  RenumberTowardHomes(replica, length, home, bags, assigned);
  EXPECT_EQ(bags, (std::vector<int32_t>{0, 1, 3, 2}));
  EXPECT_EQ(assigned, (std::vector<double>{100, 50, 60, 70}));
}

}  // namespace
}  // namespace knapformer
