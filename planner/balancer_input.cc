#include "planner/balancer_input.h"

#include "absl/strings/str_cat.h"
#include "planner/cost_model.h"

namespace knapformer {

absl::Status BalancerInput::CheckRanks(int64_t ranks, int64_t world_size) {
  if (ranks == world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("ranks: got sequence lengths for ", ranks,
                                                 " ranks, world_size is ", world_size));
}

absl::StatusOr<BalancerInput> BalancerInput::Check(int32_t world_size, RankLengths lengths,
                                                   RankMasks masks, const BalancerLimits& limits,
                                                   const RankField& masks_field) {
  if (absl::Status status = CheckRanks(static_cast<int64_t>(lengths.size()), world_size);
      !status.ok()) {
    return status;
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
  return BalancerInput(Checked{}, std::move(lengths), std::move(masks));
}

}  // namespace knapformer
