#include "planner/cost_model.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<CostModel> CostModel::Create(int64_t d_model, double gamma) {
  if (d_model < 1 || d_model > kMaxDModel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model: must be in [1, ", kMaxDModel, "], got ", d_model));
  }
  if (!std::isfinite(gamma) || gamma < 0.0 || gamma > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("gamma: must be a finite number in [0, 1e6], got ", gamma));
  }
  return CostModel(d_model, gamma);
}

}  // namespace knapformer
