#include "common/sample_stats.h"

#include <cmath>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

TEST(SampleStatsTest, PercentileIsTheNearestRank) {
  const std::vector<double> samples = {5, 1, 4, 2, 3, 10, 9, 8, 7, 6};
  EXPECT_EQ(Percentile(samples, 0.5), 5);
  EXPECT_EQ(Percentile(samples, 0.9), 9);
  EXPECT_EQ(Percentile(samples, 0.91), 10);
  EXPECT_EQ(Percentile(samples, 0.99), 10);
  EXPECT_EQ(Percentile(samples, 1.0), 10);
  EXPECT_EQ(Percentile(samples, 0.01), 1);
  EXPECT_EQ(Percentile({3.5}, 0.99), 3.5);
  EXPECT_TRUE(std::isnan(Percentile({}, 0.5)));
}

TEST(SampleStatsTest, MedianAveragesTheMiddleTwoOfAnEvenCount) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(Median({})));
}

}  // namespace
}  // namespace knapformer
