#include "planner/least_squares.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

NormalEquations::NormalEquations(int columns)
    : columns_(std::max(columns, 0)),
      g_(static_cast<size_t>(columns_) * columns_, 0.0),
      h_(columns_, 0.0) {}

void NormalEquations::AddRow(absl::Span<const double> a, double y, double weight) {
  for (int r = 0; r < columns_; ++r) {
    const double wa = weight * a[r];
    h_[r] += wa * y;
    for (int c = r; c < columns_; ++c) {
      const double v = wa * a[c];
      g_[r * columns_ + c] += v;
      if (c != r) g_[c * columns_ + r] += v;
    }
  }
}

std::vector<double> NormalEquations::NormalizeColumns() {
  std::vector<double> norm(columns_);
  for (int j = 0; j < columns_; ++j) {
    norm[j] = std::sqrt(gram(j, j));
    if (!(norm[j] > 0)) norm[j] = 1;
  }
  for (int r = 0; r < columns_; ++r) {
    h_[r] /= norm[r];
    for (int c = 0; c < columns_; ++c) g_[r * columns_ + c] /= norm[r] * norm[c];
  }
  return norm;
}

absl::StatusOr<std::vector<double>> NormalEquations::Solve(absl::Span<const int> subset) const {
  std::vector<bool> chosen(columns_, false);
  for (int j : subset) {
    if (j < 0 || j >= columns_ || chosen[j]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "subset: column ", j, " is repeated or outside [0, ", columns_, ")"));
    }
    chosen[j] = true;
  }
  const size_t n = subset.size();
  // a = D G[S][S] D | D h_S with D = diag(1 / sqrt(G[j][j])): unit diagonal.
  std::vector<double> d(n);
  for (size_t r = 0; r < n; ++r) {
    d[r] = std::sqrt(gram(subset[r], subset[r]));
    if (!(d[r] > 0) || !std::isfinite(d[r])) {
      return absl::FailedPreconditionError(
          absl::StrCat("column ", subset[r], " has no weight (or an infinite one)"));
    }
  }
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1));
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < n; ++c) a[r][c] = gram(subset[r], subset[c]) / d[r] / d[c];
    a[r][n] = rhs(subset[r]) / d[r];
  }
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (!(std::abs(a[pivot][c]) > kSingularPivot)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the columns are linearly dependent (relative pivot ", a[pivot][c], ")"));
    }
    std::swap(a[c], a[pivot]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  // Back substitution in the scaled unknowns u = x_S / D.
  std::vector<double> u(n);
  for (size_t r = n; r-- > 0;) {
    double v = a[r][n];
    for (size_t c = r + 1; c < n; ++c) v -= a[r][c] * u[c];
    u[r] = v / a[r][r];
  }
  std::vector<double> x(columns_, 0.0);
  for (size_t r = 0; r < n; ++r) x[subset[r]] = u[r] / d[r];
  return x;
}

absl::StatusOr<std::vector<double>> NormalEquations::Solve() const {
  std::vector<int> all(columns_);
  for (int j = 0; j < columns_; ++j) all[j] = j;
  return Solve(all);
}

std::vector<double> NonNegativeLeastSquares(const NormalEquations& equations) {
  const int n = equations.columns();
  std::vector<double> x(n, 0.0), z(n, 0.0);
  std::vector<bool> in_passive(n, false);
  double scale = 0;
  for (int j = 0; j < n; ++j) scale = std::max(scale, std::abs(equations.rhs(j)));
  const double tolerance = 1e-12 * std::max(scale, 1e-300);
  auto gradient = [&](int j) {
    double w = equations.rhs(j);
    for (int c = 0; c < n; ++c) w -= equations.gram(j, c) * x[c];
    return w;
  };
  for (int outer = 0; outer < 3 * n; ++outer) {
    int entering = -1;
    double best = tolerance;
    for (int j = 0; j < n; ++j) {
      if (in_passive[j]) continue;
      const double w = gradient(j);
      if (w > best) best = w, entering = j;
    }
    if (entering < 0) break;
    in_passive[entering] = true;
    for (int inner = 0; inner < 3 * n; ++inner) {
      std::vector<int> passive;
      for (int j = 0; j < n; ++j) {
        if (in_passive[j]) passive.push_back(j);
      }
      absl::StatusOr<std::vector<double>> solved = equations.Solve(passive);
      if (!solved.ok()) {
        // A column the others already span: it cannot improve the fit.
        in_passive[entering] = false;
        return x;
      }
      z = *std::move(solved);
      double alpha = 1;
      bool feasible = true;
      for (int j : passive) {
        if (z[j] <= 0) {
          feasible = false;
          const double drop = x[j] - z[j];  // > 0 but where rounding left both 0
          alpha = std::min(alpha, drop > 0 ? x[j] / drop : 0.0);
        }
      }
      if (feasible) {
        x = z;
        break;
      }
      double largest = 0;
      for (int j = 0; j < n; ++j) {
        x[j] += alpha * (z[j] - x[j]);
        largest = std::max(largest, x[j]);
      }
      // The step stops where a variable reaches 0: it leaves the passive set.
      for (int j : passive) {
        if (x[j] <= 1e-12 * largest) x[j] = 0, in_passive[j] = false;
      }
    }
  }
  return x;
}

}  // namespace knapformer
