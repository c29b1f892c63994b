#include "planner/cost_model.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<CostKind> ParseCostKind(const std::string& name, const std::string& field) {
  if (name == "transformer") return CostKind::kTransformer;
  if (name == "uniform") return CostKind::kUniform;
  if (name == "linear") return CostKind::kLinear;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown cost model '", name, "' (transformer, uniform or linear)"));
}

const char* CostKindName(CostKind kind) {
  switch (kind) {
    case CostKind::kUniform:
      return "uniform";
    case CostKind::kLinear:
      return "linear";
    case CostKind::kTransformer:
      break;
  }
  return "transformer";
}

absl::StatusOr<CostModel> CostModel::Create(int64_t d_model, double gamma, CostKind kind) {
  if (d_model < 1 || d_model > kMaxDModel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model: must be in [1, ", kMaxDModel, "], got ", d_model));
  }
  if (!std::isfinite(gamma) || gamma < 0.0 || gamma > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("gamma: must be a finite number in [0, 1e6], got ", gamma));
  }
  const double d = static_cast<double>(d_model);
  switch (kind) {
    case CostKind::kUniform:
      return CostModel(kind, d_model, gamma, 0.0, 0.0, 1.0);
    case CostKind::kLinear:
      return CostModel(kind, d_model, gamma, 1.0, 0.0, 0.0);
    case CostKind::kTransformer:
      break;
  }
  return CostModel(kind, d_model, gamma, 24.0 * d * d, gamma * 4.0 * d, 0.0);
}

}  // namespace knapformer
