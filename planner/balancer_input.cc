#include "planner/balancer_input.h"

#include "absl/strings/str_cat.h"
#include "planner/cost_model.h"

namespace knapformer {

absl::StatusOr<BalancerInput> BalancerInput::Check(int32_t world_size, RankLengths lengths,
                                                   RankMasks masks, const BalancerLimits& limits,
                                                   const RankField& masks_field) {
  if (static_cast<int64_t>(lengths.size()) != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: got sequence lengths for ", lengths.size(), " ranks, world_size is ",
        world_size));
  }
  int64_t sequences = 0;
  for (size_t rank = 0; rank < lengths.size(); ++rank) {
    sequences += static_cast<int64_t>(lengths[rank].size());
    if (sequences > limits.max_sequences) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ranks: more than ", limits.max_sequences, " sequences in the world"));
    }
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      if (length < 0 || length > CostModel::kMaxLength) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks[", rank, "][", i, "]: sequence length ", length, " is outside [0, ",
            CostModel::kMaxLength, "]"));
      }
    }
  }
  if (absl::Status status = CheckRankMasks(lengths, masks, masks_field); !status.ok()) {
    return status;
  }
  return BalancerInput(std::move(lengths), std::move(masks), sequences);
}

}  // namespace knapformer
