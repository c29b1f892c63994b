#include "planner/measured_cost.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<MeasuredAttention> MeasuredAttention::Create(std::vector<double> pairs,
                                                            std::vector<double> work,
                                                            const std::string& field) {
  if (pairs.size() != work.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", pairs.size(), " pairs but ", work.size(), " work values; one each per point"));
  }
  if (pairs.empty() || pairs.size() > static_cast<size_t>(kMaxPoints)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".pairs: needs 1 to ", kMaxPoints, " points, got ", pairs.size()));
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (!std::isfinite(pairs[i]) || pairs[i] <= 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".pairs[", i, "]: must be a finite number > 0, got ", pairs[i]));
    }
    if (i > 0 && pairs[i] <= pairs[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".pairs[", i, "]: ", pairs[i],
                                                     " must be greater than pairs[", i - 1, "] (",
                                                     pairs[i - 1], ")"));
    }
    if (!std::isfinite(work[i]) || work[i] < 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".work[", i, "]: must be a finite number >= 0, got ", work[i]));
    }
    if (i > 0 && work[i] < work[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".work[", i, "]: ", work[i], " is less than work[", i - 1, "] (",
                       work[i - 1], "); attending more pairs never costs less"));
    }
  }
  return MeasuredAttention(std::move(pairs), std::move(work));
}

double MeasuredAttention::Work(double pairs) const {
  if (!(pairs > 0.0)) return 0.0;
  const size_t last = pairs_.size() - 1;
  if (pairs >= pairs_[last]) return work_[last] * (pairs / pairs_[last]);
  // The first point above `pairs`; its left neighbour is (0, 0) before the
  // first.
  const size_t hi =
      static_cast<size_t>(std::upper_bound(pairs_.begin(), pairs_.end(), pairs) - pairs_.begin());
  const double x0 = hi == 0 ? 0.0 : pairs_[hi - 1];
  const double y0 = hi == 0 ? 0.0 : work_[hi - 1];
  return y0 + (work_[hi] - y0) * (pairs - x0) / (pairs_[hi] - x0);
}

}  // namespace knapformer
