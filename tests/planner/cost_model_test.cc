#include "planner/cost_model.h"

#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(CostModelTest, MatchesThePapersFormula) {
  auto cost = CostModel::Create(3072, 0.49);
  ASSERT_TRUE(cost.ok());
  // 24*l*d^2 + gamma*4*l^2*d at l = 4096, d = 3072.
  const double expected = 24.0 * 4096 * 3072.0 * 3072.0 + 0.49 * 4 * 4096.0 * 4096.0 * 3072;
  EXPECT_DOUBLE_EQ(cost->Workload(4096), expected);
  EXPECT_DOUBLE_EQ(cost->Linear(10), 24.0 * 10 * 3072.0 * 3072.0);
  EXPECT_DOUBLE_EQ(cost->Attention(10), 0.49 * 4 * 100 * 3072.0);
  EXPECT_EQ(cost->Workload(0), 0.0);
}

TEST(CostModelTest, StaysExactWhereInt64WouldOverflow) {
  auto cost = CostModel::Create(CostModel::kMaxDModel, 1.0);
  ASSERT_TRUE(cost.ok());
  const int64_t l = CostModel::kMaxLength;  // 2^31
  const long double d = CostModel::kMaxDModel;
  const long double exact = 24.0L * l * d * d + 4.0L * l * static_cast<long double>(l) * d;
  const double w = cost->Workload(l);
  ASSERT_TRUE(std::isfinite(w));
  EXPECT_GT(w, static_cast<double>(std::numeric_limits<int64_t>::max()));
  EXPECT_NEAR(w / static_cast<double>(exact), 1.0, 1e-15);
  // Monotone in l right up to the limit.
  EXPECT_LT(cost->Workload(l - 1), w);
}

TEST(CostModelTest, RejectsParametersOutOfRange) {
  for (int64_t d : {int64_t{0}, int64_t{-1}, CostModel::kMaxDModel + 1}) {
    auto cost = CostModel::Create(d, 0.49);
    ASSERT_FALSE(cost.ok()) << d;
    EXPECT_THAT(std::string(cost.status().message()), HasSubstr("d_model: must be in [1, 65536]"));
  }
  for (double gamma : {-0.1, std::nan(""), std::numeric_limits<double>::infinity(), 2e6}) {
    auto cost = CostModel::Create(3072, gamma);
    ASSERT_FALSE(cost.ok()) << gamma;
    EXPECT_THAT(std::string(cost.status().message()), HasSubstr("gamma: must be a finite number"));
  }
  EXPECT_TRUE(CostModel::Create(1, 0.0).ok());
}

TEST(CostModelTest, UniformAndLinearKinds) {
  auto uniform = CostModel::Create(3072, 0.49, CostKind::kUniform);
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->Workload(1), 1.0);
  EXPECT_EQ(uniform->Workload(100000), 1.0);
  EXPECT_EQ(uniform->Workload(0), 0.0);  // an empty sequence costs nothing
  EXPECT_EQ(uniform->Linear(500), 0.0);  // the item is shared, not split by tokens
  EXPECT_EQ(uniform->Attention(7), 1.0);

  auto linear = CostModel::Create(3072, 0.49, CostKind::kLinear);
  ASSERT_TRUE(linear.ok());
  EXPECT_EQ(linear->Workload(123), 123.0);
  EXPECT_EQ(linear->Linear(40), 40.0);
  EXPECT_EQ(linear->Attention(1 << 20), 0.0);

  auto transformer = CostModel::Create(64, 0.5);
  ASSERT_TRUE(transformer.ok());
  EXPECT_EQ(transformer->kind(), CostKind::kTransformer);
  EXPECT_EQ(transformer->Workload(10), 24.0 * 10 * 64 * 64 + 0.5 * 4 * 10 * 10 * 64);

  EXPECT_EQ(*ParseCostKind("uniform", "x"), CostKind::kUniform);
  EXPECT_EQ(*ParseCostKind("linear", "x"), CostKind::kLinear);
  EXPECT_EQ(*ParseCostKind("transformer", "x"), CostKind::kTransformer);
  EXPECT_EQ(ParseCostKind("quadratic", "--cost-model").status().message(),
            "--cost-model: unknown cost model 'quadratic' (transformer, uniform, linear or measured)");
  EXPECT_STREQ(CostKindName(CostKind::kLinear), "linear");
}

}  // namespace
}  // namespace knapformer
