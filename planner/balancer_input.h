#ifndef KNAPFORMER_PLANNER_BALANCER_INPUT_H_
#define KNAPFORMER_PLANNER_BALANCER_INPUT_H_

// A step's input as the balancers take it: every rank's sequence lengths and
// attention masks, checked once where they enter (a tool's file, a client's
// gathered step, a service request) and trusted inward. The balancers,
// SolveStep and the step-time prediction take one and check nothing again.

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "planner/attention_mask.h"
#include "planner/balancer_options.h"

namespace knapformer {

class BalancerInput {
 public:
  // InvalidArgument unless there are world_size lists of lengths in
  // [0, CostModel::kMaxLength] and `masks` is empty (every sequence attends
  // fully) or gives every rank one valid mask per sequence (CheckRankMasks,
  // naming masks_field(rank)); ResourceExhausted past limits.max_sequences.
  static absl::StatusOr<BalancerInput> Check(int32_t world_size, RankLengths lengths,
                                             RankMasks masks, const BalancerLimits& limits,
                                             const RankField& masks_field = MasksField);

  int32_t world_size() const { return static_cast<int32_t>(lengths_.size()); }
  const RankLengths& lengths() const { return lengths_; }
  // Null when no rank gave masks.
  const RankMasks* masks() const { return masks_.empty() ? nullptr : &masks_; }
  int64_t sequences() const { return sequences_; }

 private:
  BalancerInput(RankLengths lengths, RankMasks masks, int64_t sequences)
      : lengths_(std::move(lengths)), masks_(std::move(masks)), sequences_(sequences) {}

  RankLengths lengths_;
  RankMasks masks_;  // empty: none
  int64_t sequences_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BALANCER_INPUT_H_
