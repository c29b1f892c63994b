#include "planner/least_squares.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

TEST(LeastSquaresTest, AccumulatesWeightedNormalEquations) {
  NormalEquations equations(2);
  equations.AddRow({1.0, 2.0}, 3.0, 0.5);
  equations.AddRow({-1.0, 4.0}, 1.0);
  EXPECT_DOUBLE_EQ(equations.gram(0, 0), 0.5 * 1 + 1);
  EXPECT_DOUBLE_EQ(equations.gram(0, 1), 0.5 * 2 - 4);
  EXPECT_DOUBLE_EQ(equations.gram(1, 0), equations.gram(0, 1));
  EXPECT_DOUBLE_EQ(equations.gram(1, 1), 0.5 * 4 + 16);
  EXPECT_DOUBLE_EQ(equations.rhs(0), 0.5 * 3 - 1);
  EXPECT_DOUBLE_EQ(equations.rhs(1), 0.5 * 6 + 4);
}

TEST(LeastSquaresTest, RecoversOneColumnExactly) {
  NormalEquations equations(1);
  for (double x : {1.0, 3.0, 10.0, 1e6}) equations.AddRow({x}, 2.5 * x, 1 / (x * x));
  absl::StatusOr<std::vector<double>> solved = equations.Solve();
  ASSERT_TRUE(solved.ok()) << solved.status();
  ASSERT_EQ(solved->size(), 1u);
  EXPECT_NEAR((*solved)[0], 2.5, 1e-14);
}

TEST(LeastSquaresTest, RecoversTwoColumnsOfDifferentScales) {
  // seconds = 1e-4 + sent / 2e9, sent up to 1e9: columns 15 orders apart.
  NormalEquations equations(2);
  for (double sent : {1e3, 1e5, 1e7, 1e9}) {
    const double seconds = 1e-4 + sent / 2e9;
    equations.AddRow({1.0, sent}, seconds, 1 / (seconds * seconds));
  }
  absl::StatusOr<std::vector<double>> solved = equations.Solve();
  ASSERT_TRUE(solved.ok()) << solved.status();
  EXPECT_NEAR((*solved)[0], 1e-4, 1e-15);
  EXPECT_NEAR((*solved)[1], 0.5e-9, 1e-21);
}

TEST(LeastSquaresTest, RecoversThreeColumnsWhateverTheWeights) {
  // Noiseless: every weighting has the same exact fit, 1 - 2 a + 3 b.
  NormalEquations equations(3);
  const double rows[][3] = {{1, 0, 0}, {1, 1, 0}, {1, 0, 1}, {1, 2, 5}, {1, -3, 0.5}};
  double weight = 0.25;
  for (const auto& a : rows) {
    equations.AddRow(a, a[0] - 2 * a[1] + 3 * a[2], weight);
    weight *= 7;
  }
  absl::StatusOr<std::vector<double>> solved = equations.Solve();
  ASSERT_TRUE(solved.ok()) << solved.status();
  EXPECT_NEAR((*solved)[0], 1.0, 1e-12);
  EXPECT_NEAR((*solved)[1], -2.0, 1e-12);
  EXPECT_NEAR((*solved)[2], 3.0, 1e-12);
}

TEST(LeastSquaresTest, WeightsDecideBetweenInconsistentRows) {
  // y = 1 with weight 3 and y = 2 with weight 1: the weighted mean, 1.25.
  NormalEquations equations(1);
  equations.AddRow({1.0}, 1.0, 3.0);
  equations.AddRow({1.0}, 2.0, 1.0);
  absl::StatusOr<std::vector<double>> solved = equations.Solve();
  ASSERT_TRUE(solved.ok()) << solved.status();
  EXPECT_DOUBLE_EQ((*solved)[0], 1.25);
}

TEST(LeastSquaresTest, SolvesASubsetAndZeroesTheRest) {
  // y = 1 + 2 t; through the origin (column 1 alone) on t = 1, 2 the fit
  // minimizes (b - 3)^2 + (2 b - 5)^2: b = 13 / 5.
  NormalEquations equations(2);
  for (double t : {1.0, 2.0}) equations.AddRow({1.0, t}, 1 + 2 * t);
  const int origin[] = {1};
  absl::StatusOr<std::vector<double>> solved = equations.Solve(origin);
  ASSERT_TRUE(solved.ok()) << solved.status();
  ASSERT_EQ(solved->size(), 2u);
  EXPECT_EQ((*solved)[0], 0.0);
  EXPECT_NEAR((*solved)[1], 13.0 / 5, 1e-14);
  const int repeated[] = {1, 1};
  EXPECT_EQ(equations.Solve(repeated).status().code(), absl::StatusCode::kInvalidArgument);
  const int outside[] = {2};
  EXPECT_EQ(equations.Solve(outside).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LeastSquaresTest, ReportsSingularSystems) {
  // Proportional columns, at any scale.
  NormalEquations proportional(2);
  for (double t : {1.0, 2.0, 5.0}) proportional.AddRow({t, 1e20 * t}, t);
  absl::StatusOr<std::vector<double>> solved = proportional.Solve();
  EXPECT_EQ(solved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(solved.status().message()), ::testing::HasSubstr("linearly dependent"));
  // Each column alone is fine.
  const int first[] = {0};
  EXPECT_TRUE(proportional.Solve(first).ok());
  // A column with no weight.
  NormalEquations empty(2);
  empty.AddRow({1.0, 0.0}, 1.0);
  EXPECT_THAT(std::string(empty.Solve().status().message()), ::testing::HasSubstr("no weight"));
  // Nearly proportional: columns (1, 1) and (1, 1 + e) have det / (G00 G11)
  // about e^2 / 4: ill-conditioned below e = 2e-6, solved above.
  for (const double e : {1e-7, 1e-3}) {
    NormalEquations nearly(2);
    nearly.AddRow({1.0, 1.0}, 1.0);
    nearly.AddRow({1.0, 1.0 + e}, 1.0 + 3 * e);  // y = -2 a + 3 b
    absl::StatusOr<std::vector<double>> x = nearly.Solve();
    if (e < 2e-6) {
      EXPECT_EQ(x.status().code(), absl::StatusCode::kFailedPrecondition) << e;
    } else {
      ASSERT_TRUE(x.ok()) << e << ": " << x.status();
      EXPECT_NEAR((*x)[0], -2.0, 1e-6) << e;
      EXPECT_NEAR((*x)[1], 3.0, 1e-6) << e;
    }
  }
}

TEST(LeastSquaresTest, NormalizedColumnsGiveTheSameFit) {
  NormalEquations equations(2);
  for (double t : {1.0, 2.0, 4.0}) equations.AddRow({1e6, 1e-3 * t}, 5 + t);
  const double g00 = equations.gram(0, 0), g11 = equations.gram(1, 1);
  absl::StatusOr<std::vector<double>> raw = equations.Solve();
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::vector<double> norm = equations.NormalizeColumns();
  EXPECT_DOUBLE_EQ(norm[0], std::sqrt(g00));
  EXPECT_DOUBLE_EQ(norm[1], std::sqrt(g11));
  EXPECT_DOUBLE_EQ(equations.gram(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(equations.gram(1, 1), 1.0);
  absl::StatusOr<std::vector<double>> scaled = equations.Solve();
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_NEAR((*scaled)[0] / norm[0], 5e-6, 1e-15);
  EXPECT_NEAR((*scaled)[1] / norm[1], 1e3, 1e-9);
  EXPECT_NEAR((*raw)[0], 5e-6, 1e-15);
  EXPECT_NEAR((*raw)[1], 1e3, 1e-9);
}

TEST(LeastSquaresTest, NonNegativeClampsANegativeCoefficient) {
  // Exactly y = 2 a - b: unconstrained (2, -1). With b >= 0 the fit is b = 0
  // and a the least squares of rows (1, 0) -> 2, (0, 1) -> -1, (1, 1) -> 1
  // on a alone: a = (2 + 1) / 2.
  NormalEquations equations(2);
  equations.AddRow({1.0, 0.0}, 2.0);
  equations.AddRow({0.0, 1.0}, -1.0);
  equations.AddRow({1.0, 1.0}, 1.0);
  absl::StatusOr<std::vector<double>> free = equations.Solve();
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_NEAR((*free)[0], 2.0, 1e-14);
  EXPECT_NEAR((*free)[1], -1.0, 1e-14);
  const std::vector<double> x = NonNegativeLeastSquares(equations);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_NEAR(x[0], 1.5, 1e-14);
  EXPECT_EQ(x[1], 0.0);
}

TEST(LeastSquaresTest, NonNegativeKeepsAFeasibleFit) {
  // Exactly y = 1 + 2 t + 0.5 t^2: every coefficient > 0, so the
  // unconstrained fit stands.
  NormalEquations equations(3);
  for (double t : {0.0, 1.0, 2.0, 3.0, 5.0}) {
    equations.AddRow({1.0, t, t * t}, 1 + 2 * t + t * t / 2);
  }
  equations.NormalizeColumns();
  const std::vector<double> x = NonNegativeLeastSquares(equations);
  absl::StatusOr<std::vector<double>> free = equations.Solve();
  ASSERT_TRUE(free.ok()) << free.status();
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(x[j], (*free)[j], 1e-12 * std::abs((*free)[j])) << j;
  // Nothing positive to gain: all zeros.
  NormalEquations falling(1);
  for (double t : {1.0, 2.0}) falling.AddRow({t}, -t);
  EXPECT_EQ(NonNegativeLeastSquares(falling), std::vector<double>({0.0}));
}

}  // namespace
}  // namespace knapformer
