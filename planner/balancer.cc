#include "planner/balancer.h"

#include <utility>

#include "absl/status/status.h"
#include "planner/rank_speeds.h"
#include "planner/replica_solve.h"

namespace knapformer {

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const BalancerInput& input, const BalancerOptions& options) {
  if (absl::Status status = BalancerInput::CheckRanks(input.world_size(), world.world_size());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRankSpeeds(options.rank_speeds, world.world_size());
      !status.ok()) {
    return status;
  }
  const RankLengths& lengths = input.lengths();
  const RankMasks* masks = input.masks();
  std::vector<int32_t> first_sequence = internal::FirstSequences(lengths);
  // Phase 1: replica-relative bag per sequence.
  std::vector<int32_t> bag_of(first_sequence.back(), -1);
  const int32_t group = world.group_size();
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    absl::Status assigned =
        internal::AssignReplicaBags(world.replica_topology(replica), cost, options, lengths,
                                    replica * group, first_sequence, bag_of, masks);
    if (!assigned.ok()) return assigned;
  }
  return internal::BuildPlan(world, cost, lengths, options.limits, std::move(first_sequence),
                             bag_of, masks);
}

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const RankLengths& lengths, const BalancerOptions& options,
                                   const RankMasks* masks) {
  absl::StatusOr<BalancerInput> input =
      BalancerInput::Check(world.world_size(), lengths, masks ? *masks : RankMasks(),
                           options.limits);
  if (!input.ok()) return input.status();
  return BalanceGreedy(world, cost, *input, options);
}

}  // namespace knapformer
