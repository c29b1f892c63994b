#ifndef KNAPFORMER_PLANNER_LEAST_SQUARES_H_
#define KNAPFORMER_PLANNER_LEAST_SQUARES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace knapformer {

// The planner's least squares, in one place: the cost model's fit
// (calibration.h), the links' (exchange_fit.h) and the measured attention
// table's (measured_fit.h). Each has few columns (at most kPairGridPoints)
// and many rows, so it accumulates the normal equations and keeps no row.

// The normal equations G x = h of min_x sum_r w_r (a_r . x - y_r)^2 over
// `columns` unknowns: G = A'WA, h = A'Wy.
class NormalEquations {
 public:
  explicit NormalEquations(int columns);

  int columns() const { return columns_; }
  // G[r][c] and h[r].
  double gram(int r, int c) const { return g_[r * columns_ + c]; }
  double rhs(int r) const { return h_[r]; }

  // Adds the row `a` (a.size() == columns()) with target `y` and weight
  // `weight` >= 0: G += weight a a', h += weight a y.
  void AddRow(absl::Span<const double> a, double y, double weight = 1.0);

  // Scales each column to unit norm (G[j][j] = 1), so that columns of
  // different units weigh alike in tolerances taken over all of them, such
  // as NonNegativeLeastSquares'. Returns the norms sqrt(G[j][j]) (1 for a
  // column with no weight, left as it is): the unknowns of the scaled
  // equations are norm_j x_j.
  std::vector<double> NormalizeColumns();

  // x solving G[S][S] x_S = h_S for the columns S = `subset` (distinct, in
  // [0, columns())); the other x_j are 0. Gaussian elimination with partial
  // pivoting on G[S][S] scaled to a unit diagonal, so that the singularity
  // check does not depend on the columns' units: FailedPrecondition where a
  // column of S has no weight (or an infinite one), or a pivot is <=
  // kSingularPivot, i.e. the columns are linearly dependent to about 12
  // digits (for two columns: det <= 1e-12 * G[0][0] * G[1][1]).
  // InvalidArgument: `subset` out of range or repeated.
  absl::StatusOr<std::vector<double>> Solve(absl::Span<const int> subset) const;
  // All columns.
  absl::StatusOr<std::vector<double>> Solve() const;

  static constexpr double kSingularPivot = 1e-12;

 private:
  int columns_;
  std::vector<double> g_;  // row-major, columns_ x columns_, symmetric
  std::vector<double> h_;
};

// min_x sum_r w_r (a_r . x - y_r)^2 over x >= 0 from the normal equations:
// Lawson and Hanson's active-set method, each step a Solve on the passive
// (free) columns. A column the passive ones already span (Solve fails)
// cannot improve the fit: the search ends with the fit so far. Its
// tolerance is 1e-12 * max |h|, one for all columns: normalize them first.
std::vector<double> NonNegativeLeastSquares(const NormalEquations& equations);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_LEAST_SQUARES_H_
