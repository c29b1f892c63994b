// The measured cost model: its table checks and interpolates, the model
// prices attention by it (masked or not), and a table is fitted from
// calibration samples.
#include "planner/measured_cost.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

MeasuredAttention Table(std::vector<double> pairs, std::vector<double> work) {
  return *MeasuredAttention::Create(std::move(pairs), std::move(work), "t");
}

TEST(MeasuredAttentionTest, InterpolatesFromTheOriginAndGrowsWithThePairsPastTheLast) {
  const MeasuredAttention table = Table({100, 400}, {50, 80});
  EXPECT_EQ(table.Work(0), 0.0);
  EXPECT_EQ(table.Work(-3), 0.0);
  EXPECT_DOUBLE_EQ(table.Work(50), 25.0);   // (0,0)..(100,50)
  EXPECT_DOUBLE_EQ(table.Work(100), 50.0);  // a point
  EXPECT_DOUBLE_EQ(table.Work(250), 65.0);  // (100,50)..(400,80)
  EXPECT_DOUBLE_EQ(table.Work(400), 80.0);
  EXPECT_DOUBLE_EQ(table.Work(800), 160.0);  // in proportion past the last
}

TEST(MeasuredAttentionTest, NamesTheBadPoint) {
  struct Case {
    std::vector<double> pairs, work;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{}, {}, "t.pairs: needs 1 to 1024 points, got 0"},
           {{1, 2}, {1}, "t: 2 pairs but 1 work values"},
           {{0}, {1}, "t.pairs[0]: must be a finite number > 0, got 0"},
           {{1, NAN}, {1, 2}, "t.pairs[1]: must be a finite number > 0"},
           {{2, 2}, {1, 2}, "t.pairs[1]: 2 must be greater than pairs[0] (2)"},
           {{1, 2}, {-1, 2}, "t.work[0]: must be a finite number >= 0, got -1"},
           {{1, 2}, {3, 2}, "t.work[1]: 2 is less than work[0] (3)"},
           {std::vector<double>(1025, 1), std::vector<double>(1025, 1), "got 1025"},
       }) {
    auto table = MeasuredAttention::Create(c.pairs, c.work, "t");
    ASSERT_FALSE(table.ok()) << c.message;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(c.message));
  }
}

TEST(MeasuredCostModelTest, KeepsTheTransformersLinearTermAndPricesAttentionByTheTable) {
  const MeasuredAttention table = Table({1024 * 1024.0}, {5e9});
  auto measured = CostModel::Create(64, 0.49, CostKind::kMeasured, &table);
  auto transformer = CostModel::Create(64, 0.49);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->kind(), CostKind::kMeasured);
  EXPECT_EQ(measured->Linear(1000), transformer->Linear(1000));
  EXPECT_DOUBLE_EQ(measured->Attention(1024), 5e9);
  EXPECT_DOUBLE_EQ(measured->Attention(512), 5e9 / 4);
  EXPECT_EQ(measured->Attention(0), 0.0);
  EXPECT_DOUBLE_EQ(measured->Workload(512), transformer->Linear(512) + 5e9 / 4);
  // Under a mask, by the pairs it attends: causal 1024 attends 1024*1025/2.
  const AttentionMask causal = AttentionMask::Causal();
  EXPECT_DOUBLE_EQ(measured->Attention(1024, &causal), 5e9 * (1024 * 1025 / 2.0) / (1024 * 1024));
  // Copies share the table.
  const CostModel copy = *measured;
  EXPECT_EQ(copy.measured(), measured->measured());
  EXPECT_TRUE(PricedInFlops(CostKind::kMeasured));
  EXPECT_FALSE(PricedInFlops(CostKind::kLinear));
  EXPECT_EQ(*ParseCostKind("measured", "x"), CostKind::kMeasured);
  EXPECT_STREQ(CostKindName(CostKind::kMeasured), "measured");
}

TEST(MeasuredCostModelTest, TheTableComesExactlyWithTheMeasuredKind) {
  const MeasuredAttention table = Table({1}, {1});
  auto without = CostModel::Create(64, 0.49, CostKind::kMeasured);
  ASSERT_FALSE(without.ok());
  EXPECT_THAT(std::string(without.status().message()),
              HasSubstr("measured_attention: the measured cost model needs its table"));
  auto stray = CostModel::Create(64, 0.49, CostKind::kTransformer, &table);
  ASSERT_FALSE(stray.ok());
  EXPECT_THAT(std::string(stray.status().message()),
              HasSubstr("only for the measured cost model, not transformer"));
}

TEST(MeasuredAttentionFromSamplesTest, SubtractsTheLinearTermAveragesAndKeepsItNondecreasing) {
  const int64_t d = 64;
  const double k = 1e-12;
  // Attention seconds by length, as a kernel that is flat at short
  // lengths and noisy: 256 measured twice (mean 3e-6), 512 below 256.
  const std::vector<std::pair<int64_t, double>> attention_seconds = {
      {256, 2e-6}, {256, 4e-6}, {512, 1e-6}, {1024, 8e-6}};
  std::vector<WorkSample> samples;
  for (const auto& [length, attention] : attention_seconds) {
    WorkSample s = SequenceSample(length, d, 0);
    s.seconds = k * s.linear + attention;
    samples.push_back(s);
  }
  samples.push_back(SequenceSample(0, d, 1e-6));  // no pairs: skipped
  CostFit fit;
  fit.k = k;
  auto table = MeasuredAttentionFromSamples(samples, fit, d);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->pairs(), (std::vector<double>{256.0 * 256, 512.0 * 512, 1024.0 * 1024}));
  // 256 (mean 3e-6) and 512 (1e-6) pool to their weighted mean: (2*3 + 1) / 3.
  const double pooled = (2 * 3e-6 + 1e-6) / 3 / k;
  EXPECT_NEAR(table->work()[0], pooled, 1e-6 * pooled);
  EXPECT_NEAR(table->work()[1], pooled, 1e-6 * pooled);
  EXPECT_NEAR(table->work()[2], 8e-6 / k, 1e-6 * 8e-6 / k);

  fit.k = 0;
  EXPECT_THAT(std::string(MeasuredAttentionFromSamples(samples, fit, d).status().message()),
              HasSubstr("fit.k: must be a finite number > 0"));
  fit.k = k;
  EXPECT_THAT(std::string(MeasuredAttentionFromSamples({SequenceSample(0, d, 1)}, fit, d)
                              .status()
                              .message()),
              HasSubstr("none attends any pairs"));
}

TEST(MeasuredAttentionFromSamplesTest, ATransformersTimesGiveItsOwnAttention) {
  // Times that follow the transformer model exactly: the table is its
  // attention term, and the measured model prices as the transformer.
  const int64_t d = 128;
  const double k = 3e-13, gamma = 0.7;
  std::vector<WorkSample> samples;
  for (int64_t length = 64; length <= 8192; length *= 2) {
    WorkSample s = SequenceSample(length, d, 0);
    s.seconds = k * (s.linear + gamma * s.attention);
    samples.push_back(s);
  }
  CostFit fit;
  fit.k = k;
  fit.gamma = gamma;
  auto table = MeasuredAttentionFromSamples(samples, fit, d);
  ASSERT_TRUE(table.ok()) << table.status();
  auto measured = CostModel::Create(d, gamma, CostKind::kMeasured, &*table);
  auto transformer = CostModel::Create(d, gamma);
  for (int64_t length : {1, 64, 100, 3000, 8192, 20000}) {
    EXPECT_NEAR(measured->Workload(length), transformer->Workload(length),
                1e-9 * transformer->Workload(length))
        << length;
  }
}

}  // namespace
}  // namespace knapformer
