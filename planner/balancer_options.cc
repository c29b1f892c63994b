#include "planner/balancer_options.h"

#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<GreedyRule> ParseGreedyRule(const std::string& name, const std::string& field) {
  if (name == "earliest-finish") return GreedyRule::kEarliestFinish;
  if (name == "least-occupied") return GreedyRule::kLeastOccupied;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unknown greedy rule '", name, "' (earliest-finish or least-occupied)"));
}

const char* GreedyRuleName(GreedyRule rule) {
  return rule == GreedyRule::kLeastOccupied ? "least-occupied" : "earliest-finish";
}

}  // namespace knapformer
