#include "planner/packing_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace knapformer {
namespace {

// The fewest bags of workload `capacity` the sequences need, by L2; more
// than `bags` means that capacity is infeasible. `prefix[i]` is the sum of
// the i heaviest. The ceilings give 1e-9 of a bag away, so that rounding in
// the sums (about 1e-16 relative) cannot add a bag that is not needed.
int64_t BagsNeeded(const std::vector<double>& w, const std::vector<double>& prefix,
                   double capacity) {
  const int64_t n = static_cast<int64_t>(w.size());
  if (n == 0) return 0;
  if (w[0] > capacity) return std::numeric_limits<int64_t>::max();  // fits no bag
  auto ceil_down = [](double x) { return static_cast<int64_t>(std::ceil(x - 1e-9)); };
  // Counts of sequences above a threshold / at least a threshold (w is descending).
  // lower_bound finds the first workload not above t, upper_bound the first below it.
  auto above = [&](double t) {
    return static_cast<int64_t>(
        std::lower_bound(w.begin(), w.end(), t, std::greater<double>()) - w.begin());
  };
  auto at_least = [&](double t) {
    return static_cast<int64_t>(
        std::upper_bound(w.begin(), w.end(), t, std::greater<double>()) - w.begin());
  };
  int64_t best = ceil_down(prefix[n] / capacity);
  const int64_t big = above(capacity / 2);  // n1 + n2, whatever a is
  // a = 0, then every distinct workload of at most C/2 (those change the sets).
  double previous = -1;
  for (int64_t j = n; j >= big; --j) {
    const double a = j == n ? 0.0 : w[j];
    if (a == previous) continue;
    previous = a;
    const int64_t n1 = above(capacity - a);
    const int64_t n2 = big - n1;
    const int64_t last = a > 0 ? at_least(a) : n;  // [big, last) is J3
    const double s23 = prefix[std::max(last, big)] - prefix[n1];
    best = std::max(best, n1 + std::max(n2, ceil_down(s23 / capacity)));
  }
  return best;
}

double PigeonholeBound(const std::vector<double>& w, int32_t bags, int32_t gpus) {
  double bound = 0;
  const int64_t n = static_cast<int64_t>(w.size());
  for (int64_t k = 1; k * bags + 1 <= n; ++k) {
    double together = 0;
    for (int64_t j = k * bags - k; j <= k * bags; ++j) together += w[j];
    bound = std::max(bound, together / gpus);
  }
  return bound;
}

}  // namespace

double UniformBagsLowerBound(const std::vector<double>& workloads, int32_t bags, int32_t gpus,
                             double known) {
  double bound = std::max(known, PigeonholeBound(workloads, bags, gpus));
  if (workloads.empty() || bags <= 0) return bound;
  std::vector<double> prefix(workloads.size() + 1, 0.0);
  for (size_t i = 0; i < workloads.size(); ++i) prefix[i + 1] = prefix[i] + workloads[i];
  // Per GPU: a bag of capacity C * gpus. Between the bound so far and where
  // every bag could hold a fair share plus the heaviest sequence.
  double lo = bound;
  double hi = std::max(bound, (prefix.back() / bags + workloads[0]) / gpus);
  for (int round = 0; round < 48 && lo < hi; ++round) {
    const double middle = lo + (hi - lo) / 2;
    if (BagsNeeded(workloads, prefix, middle * gpus) > bags) {
      lo = middle;  // proven infeasible, and so is everything below it
      bound = std::max(bound, middle);
    } else {
      hi = middle;
    }
  }
  return bound;
}

}  // namespace knapformer
