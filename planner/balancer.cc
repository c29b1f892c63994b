#include "planner/balancer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/parallel_for.h"
#include "planner/rank_speeds.h"
#include "planner/replica_packer.h"
#include "planner/replica_solve.h"

namespace knapformer {

absl::Status CheckThreads(const BalancerOptions& options) {
  if (options.threads < 1 || options.threads > BalancerOptions::kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("threads: ", options.threads,
                                                   " is outside [1, ",
                                                   BalancerOptions::kMaxThreads, "]"));
  }
  return absl::OkStatus();
}

namespace internal {

int32_t SolverThreads(const BalancerOptions& options, int64_t sequences) {
  return sequences >= kParallelMinSequences ? options.threads : 1;
}

}  // namespace internal

namespace {

// BalanceGreedy's plan without plan.masks (BuildPlan leaves them to the caller).
absl::StatusOr<Plan> PlanWithoutMasks(const World& world, const CostModel& cost,
                                      const BalancerInput& input,
                                      const BalancerOptions& options) {
  if (absl::Status status = BalancerInput::CheckRanks(input.world_size(), world.world_size());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRankSpeeds(options.rank_speeds, world.world_size());
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckThreads(options); !status.ok()) return status;
  const RankLengths& lengths = input.lengths();
  const RankMasks* masks = input.masks();
  std::vector<int32_t> first_sequence = internal::FirstSequences(lengths);
  // Phase 1: replica-relative bag per sequence. Replicas are independent and
  // each writes only its own sequences' entries; the first failing one (in
  // replica order) is the error, however many threads ran them.
  std::vector<int32_t> bag_of(first_sequence.back(), -1);
  const int32_t group = world.group_size();
  std::vector<absl::StatusOr<int64_t>> assigned(world.num_replicas());
  internal::ParallelFor(
      world.num_replicas(), internal::SolverThreads(options, first_sequence.back()),
      [&](int32_t replica) {
        const int32_t first_rank = replica * group;
        assigned[replica] = internal::AssignReplicaBags(
            world.replica_topology(replica), options,
            internal::SortReplicaSequences(cost, lengths, first_rank, group, first_sequence,
                                           masks),
            first_rank, first_sequence, bag_of);
      });
  int64_t num_chunks = 0;
  for (const absl::StatusOr<int64_t>& chunks : assigned) {
    if (!chunks.ok()) return chunks.status();
    num_chunks += *chunks;
  }
  return internal::BuildPlan(world, cost, lengths, options, std::move(first_sequence),
                             bag_of, num_chunks, masks);
}

}  // namespace

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const BalancerInput& input, const BalancerOptions& options) {
  absl::StatusOr<Plan> plan = PlanWithoutMasks(world, cost, input, options);
  if (plan.ok() && input.masks() != nullptr) plan->masks = *input.masks();
  return plan;
}

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   BalancerInput&& input, const BalancerOptions& options) {
  absl::StatusOr<Plan> plan = PlanWithoutMasks(world, cost, input, options);
  if (plan.ok()) plan->masks = std::move(input).TakeMasks();
  return plan;
}

absl::StatusOr<Plan> BalanceGreedy(const World& world, const CostModel& cost,
                                   const RankLengths& lengths, const BalancerOptions& options,
                                   const RankMasks* masks) {
  absl::StatusOr<BalancerInput> input =
      BalancerInput::Check(world.world_size(), lengths, masks ? *masks : RankMasks(),
                           options.limits);
  if (!input.ok()) return input.status();
  return BalanceGreedy(world, cost, *std::move(input), options);
}

}  // namespace knapformer
