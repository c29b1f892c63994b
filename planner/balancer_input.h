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
  // The masks, moved out: for a caller done with the input (a plan keeps
  // them) that would otherwise copy every one. The lengths stay.
  RankMasks TakeMasks() && { return std::move(masks_); }

  // InvalidArgument unless `ranks` lists of lengths are for a world of
  // `world_size` ranks: what takes an input checks it is its world's.
  static absl::Status CheckRanks(int64_t ranks, int64_t world_size);

 private:
  // The tag keeps a braced list of lengths and masks (as the plain-vector
  // BalanceGreedy takes) from matching this constructor too.
  struct Checked {};
  BalancerInput(Checked, RankLengths lengths, RankMasks masks)
      : lengths_(std::move(lengths)), masks_(std::move(masks)) {}

  RankLengths lengths_;
  RankMasks masks_;  // empty: none
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BALANCER_INPUT_H_
