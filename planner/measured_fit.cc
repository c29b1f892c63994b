#include "planner/measured_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/least_squares.h"

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
  NormalEquations equations(static_cast<int>(m));
  std::vector<double> row(m);
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
    equations.AddRow(row, attention_seconds);
  }
  if (prior != nullptr) {
    // Point i's row: (seconds at i - the scaled prior's) relative to the
    // scaled prior's (or to a millionth of the longest step where it is 0).
    const double scale = prior_xx > 0 && prior_xy > 0 ? prior_xy / prior_xx : 1.0;
    constexpr double kPriorWeight = 1e-3;  // squared: a millionth
    // Point i's seconds: increments 0 .. i.
    std::vector<double> up_to(m, 0.0);
    for (size_t i = 0; i < m; ++i) {
      up_to[i] = 1;
      const double target = scale * prior_seconds[i];
      const double w = kPriorWeight / std::max(target, 1e-6 * longest);
      if (!std::isfinite(w)) continue;
      equations.AddRow(up_to, target, w * w);
    }
  }
  const std::vector<double> norm = equations.NormalizeColumns();
  const std::vector<double> increments = NonNegativeLeastSquares(equations);
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
