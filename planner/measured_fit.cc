#include "planner/measured_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace knapformer {

double PairGridPoint(int j) { return std::ldexp(1.0, 2 * j); }

namespace {

// Adds `share` of a sequence attending `pairs` pairs to the two grid points
// around it, as MeasuredAttention interpolates (from (0, 0) below the first).
void AddPairs(double pairs, double share, PairWeights& weights) {
  if (!(pairs > 0)) return;
  if (pairs <= 1) {
    weights[0] += static_cast<float>(share * pairs);
    return;
  }
  int below = std::min(kPairGridPoints - 1, static_cast<int>(std::log2(pairs)) / 2);
  // log2 may round across a power of 4: settle on lo <= pairs < hi.
  while (below > 0 && PairGridPoint(below) > pairs) --below;
  while (below < kPairGridPoints - 1 && PairGridPoint(below + 1) <= pairs) ++below;
  const double lo = PairGridPoint(below);
  if (below == kPairGridPoints - 1 || pairs == lo) {
    weights[below] += static_cast<float>(share * pairs / lo);
    return;
  }
  const double hi = PairGridPoint(below + 1);
  const double above = (pairs - lo) / (hi - lo);
  weights[below] += static_cast<float>(share * (1 - above));
  weights[below + 1] += static_cast<float>(share * above);
}

// Solves g[p][p] z = h[p] for the indices in `passive` by Gaussian
// elimination with partial pivoting; false when singular.
bool SolvePassive(const std::vector<std::vector<double>>& g, const std::vector<double>& h,
                  const std::vector<int>& passive, std::vector<double>& z) {
  const size_t n = passive.size();
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1));
  for (size_t r = 0; r < n; ++r) {
    for (size_t c = 0; c < n; ++c) a[r][c] = g[passive[r]][passive[c]];
    a[r][n] = h[passive[r]];
  }
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (!(std::abs(a[pivot][c]) > 1e-12)) return false;
    std::swap(a[c], a[pivot]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::fill(z.begin(), z.end(), 0.0);
  for (size_t r = n; r-- > 0;) {
    double v = a[r][n];
    for (size_t c = r + 1; c < n; ++c) v -= a[r][c] * z[passive[c]];
    z[passive[r]] = v / a[r][r];
  }
  return true;
}

// min |A x - b| over x >= 0 from the normal equations (g = A'A with unit
// diagonal where a column has any weight, h = A'b): Lawson and Hanson's
// active-set method. The columns here are few (grid points), the rows many.
std::vector<double> NonNegativeLeastSquares(const std::vector<std::vector<double>>& g,
                                            const std::vector<double>& h) {
  const int n = static_cast<int>(h.size());
  std::vector<double> x(n, 0.0), z(n, 0.0);
  std::vector<bool> in_passive(n, false);
  double scale = 0;
  for (double v : h) scale = std::max(scale, std::abs(v));
  const double tolerance = 1e-12 * std::max(scale, 1e-300);
  auto gradient = [&](int j) {
    double w = h[j];
    for (int c = 0; c < n; ++c) w -= g[j][c] * x[c];
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
      if (!SolvePassive(g, h, passive, z)) {
        // A column the others already span: it cannot improve the fit.
        in_passive[entering] = false;
        return x;
      }
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

}  // namespace

std::vector<PairWeights> RankPairWeights(const Plan& plan, const RankMasks* masks) {
  std::vector<PairWeights> weights(plan.world_size, PairWeights{});
  for (const PlacedSequence& seq : plan.sequences) {
    if (seq.bag < 0) continue;
    const AttentionMask* mask = MaskOf(masks, seq.src_rank, seq.seq_index);
    const double l = static_cast<double>(seq.length);
    const double pairs = mask == nullptr ? l * l : AttendedPairs(seq.length, *mask);
    const int32_t gpus = plan.bag_gpus[seq.bag];
    for (int32_t p = 0; p < gpus; ++p) {
      AddPairs(pairs, 1.0 / gpus, weights[plan.bag_first_rank[seq.bag] + p]);
    }
  }
  return weights;
}

absl::StatusOr<MeasuredAttention> FitMeasuredAttentionFromSteps(
    const std::vector<StepSample>& steps, double k, const MeasuredAttention* prior) {
  if (!std::isfinite(k) || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("k: must be a finite number > 0, got ", k));
  }
  std::array<bool, kPairGridPoints> attended{};
  for (size_t s = 0; s < steps.size(); ++s) {
    const WorkSample& work = steps[s].work;
    bool finite = std::isfinite(work.linear) && work.linear >= 0 &&
                  std::isfinite(work.seconds) && work.seconds >= 0;
    for (int j = 0; j < kPairGridPoints; ++j) {
      const float w = steps[s].weights[j];
      finite = finite && std::isfinite(w) && w >= 0;
      if (w > 0) attended[j] = true;
    }
    if (!finite) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps[", s, "]: values must be finite and >= 0"));
    }
  }
  // The table's points: the grid points some step attends around.
  std::vector<int> points;
  for (int j = 0; j < kPairGridPoints; ++j) {
    if (attended[j]) points.push_back(j);
  }
  if (points.empty()) {
    return absl::InvalidArgumentError("steps: none attends any pairs; nothing to tabulate");
  }
  const size_t m = points.size();
  if (steps.size() < 2 * m) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps: ", steps.size(), " timings (one per rank and step) for a table of ", m,
        " points (sequences of lengths near 2^", points.front(), " to 2^", points.back(),
        " tokens); the fit needs at least ", 2 * m));
  }
  // The unknowns are the table's increments (seconds) d_i >= 0: the seconds
  // at point i are d_0 + ... + d_i, so the table is >= 0 and nondecreasing.
  // A step's column i is then its weight at points i and above. Rows are
  // divided by the step's time (relative residuals), and columns scaled to
  // unit norm for the solve.
  std::vector<std::vector<double>> g(m, std::vector<double>(m, 0.0));
  std::vector<double> h(m, 0.0), row(m);
  // The prior's seconds at each point, and its scale that best explains the
  // steps (its shape is what guides the fit, not its level: a table from
  // another device, or a gamma line, may be off by a factor throughout).
  std::vector<double> prior_seconds(m, 0.0);
  if (prior != nullptr) {
    for (size_t i = 0; i < m; ++i) prior_seconds[i] = k * prior->Work(PairGridPoint(points[i]));
  }
  double prior_xx = 0, prior_xy = 0, longest = 0;
  for (const StepSample& step : steps) {
    longest = std::max(longest, step.work.seconds);
    const double w = step.work.seconds > 0 ? 1.0 / step.work.seconds : 1.0;
    double above = 0;
    for (size_t i = m; i-- > 0;) {
      above += step.weights[points[i]];
      row[i] = w * above;
    }
    const double attention_seconds = w * (step.work.seconds - k * step.work.linear);
    if (prior != nullptr) {
      double priced = 0;
      for (size_t i = 0; i < m; ++i) priced += step.weights[points[i]] * prior_seconds[i];
      prior_xx += w * priced * w * priced;
      prior_xy += w * priced * attention_seconds;
    }
    for (size_t i = 0; i < m; ++i) {
      h[i] += row[i] * attention_seconds;
      for (size_t c = 0; c < m; ++c) g[i][c] += row[i] * row[c];
    }
  }
  if (prior != nullptr) {
    // Point i's row: (seconds at i - the scaled prior's) relative to the
    // scaled prior's (or to a millionth of the longest step where it is 0).
    const double scale = prior_xx > 0 && prior_xy > 0 ? prior_xy / prior_xx : 1.0;
    constexpr double kPriorWeight = 1e-3;  // squared: a millionth
    for (size_t i = 0; i < m; ++i) {
      const double target = scale * prior_seconds[i];
      const double w = kPriorWeight / std::max(target, 1e-6 * longest);
      if (!std::isfinite(w)) continue;
      for (size_t a = 0; a <= i; ++a) {
        h[a] += w * w * target;
        for (size_t c = 0; c <= i; ++c) g[a][c] += w * w;
      }
    }
  }
  std::vector<double> norm(m);
  for (size_t i = 0; i < m; ++i) norm[i] = std::sqrt(g[i][i]);
  for (size_t i = 0; i < m; ++i) {
    h[i] /= norm[i];
    for (size_t c = 0; c < m; ++c) g[i][c] /= norm[i] * norm[c];
  }
  const std::vector<double> increments = NonNegativeLeastSquares(g, h);
  std::vector<double> pairs(m), work(m);
  double seconds = 0;
  for (size_t i = 0; i < m; ++i) {
    seconds += increments[i] / norm[i];
    pairs[i] = PairGridPoint(points[i]);
    work[i] = seconds / k;
  }
  return MeasuredAttention::Create(std::move(pairs), std::move(work), "fitted table");
}

}  // namespace knapformer
