#include "planner/cost_model.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<CostKind> ParseCostKind(const std::string& name, const std::string& field) {
  if (name == "transformer") return CostKind::kTransformer;
  if (name == "uniform") return CostKind::kUniform;
  if (name == "linear") return CostKind::kLinear;
  if (name == "measured") return CostKind::kMeasured;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown cost model '", name, "' (transformer, uniform, linear or measured)"));
}

const char* CostKindName(CostKind kind) {
  switch (kind) {
    case CostKind::kUniform:
      return "uniform";
    case CostKind::kLinear:
      return "linear";
    case CostKind::kMeasured:
      return "measured";
    case CostKind::kTransformer:
      break;
  }
  return "transformer";
}

bool PricedInFlops(CostKind kind) {
  return kind == CostKind::kTransformer || kind == CostKind::kMeasured;
}

absl::StatusOr<CostModel> CostModel::Create(int64_t d_model, double gamma, CostKind kind,
                                            const MeasuredAttention* measured) {
  if (d_model < 1 || d_model > kMaxDModel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "d_model: must be in [1, ", kMaxDModel, "], got ", d_model));
  }
  if (!std::isfinite(gamma) || gamma < 0.0 || gamma > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("gamma: must be a finite number in [0, 1e6], got ", gamma));
  }
  if (kind == CostKind::kMeasured && measured == nullptr) {
    return absl::InvalidArgumentError(
        "measured_attention: the measured cost model needs its table (knapformer calibrate "
        "--table writes one)");
  }
  if (kind != CostKind::kMeasured && measured != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("measured_attention: a table is only for the measured cost model, not ",
                     CostKindName(kind)));
  }
  const double d = static_cast<double>(d_model);
  switch (kind) {
    case CostKind::kUniform:
      return CostModel(kind, d_model, gamma, 0.0, 0.0, 1.0);
    case CostKind::kLinear:
      return CostModel(kind, d_model, gamma, 1.0, 0.0, 0.0);
    case CostKind::kMeasured:
      return CostModel(kind, d_model, gamma, 24.0 * d * d, 0.0, 0.0,
                       std::make_shared<const MeasuredAttention>(*measured));
    case CostKind::kTransformer:
      break;
  }
  return CostModel(kind, d_model, gamma, 24.0 * d * d, gamma * 4.0 * d, 0.0);
}

}  // namespace knapformer
