#include "tests/fuzz/solve_check.h"

#include <numeric>
#include <vector>

#include "client/route_layout.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/validate.h"
#include "proto/plan_proto.h"
#include "proto/step_problem.h"
#include "tests/fuzz/fuzz_check.h"

namespace knapformer::fuzz {
namespace {

// Rows listed per rank by the layout checks: beyond this the check is
// skipped (the fuzzer's inputs are small; the solver still ran).
constexpr int64_t kMaxRowsToList = 1 << 16;

void CheckSlice(const Plan& plan, const World& world, const RankLengths& lengths, int32_t rank) {
  v1::RankPlan proto;
  RankPlanToProto(plan.Slice(rank), &proto);
  absl::StatusOr<RankPlan> slice = RankPlanFromProto(proto, plan.world_size);
  Require(slice.ok(), "a slice survives the wire", slice.status().ToString());
  const RankLocation where = world.Locate(rank);
  const Bag& bag = world.topology().bag(where.bag);
  const int32_t first_rank = world.RankOf({where.replica, where.bag, 0});
  absl::StatusOr<RouteLayout> layout =
      DeriveRouteLayout(*slice, lengths[rank], rank, plan.world_size, bag.gpus, first_rank);
  Require(layout.ok(), "the client accepts the service's slice", layout.status().ToString());
  Require(slice->attention_masks.size() ==
              (plan.masks.empty() ? 0 : layout->attention_lengths.size()),
          "one mask per sequence attention sees, in a masked plan");
  for (size_t k = 0; k < slice->attention_masks.size(); ++k) {
    const UlyssesSequence* seq =
        bag.gpus > 1 ? &slice->ulysses.sequences[k] : nullptr;
    const int32_t src = seq != nullptr ? seq->src_rank : slice->route.recvs[k].peer;
    const int32_t index = seq != nullptr ? seq->seq_index : slice->route.recvs[k].seq_index;
    Require(slice->attention_masks[k] == plan.masks[src][index],
            "a held mask is its sequence's own");
  }
  RequirePermutation(layout->send_index, "the send order is a permutation of the input");
  if (bag.gpus > 1 && layout->attention_rows <= kMaxRowsToList) {
    const std::vector<int64_t> index = AttentionIndex(layout->ulysses_recv_rows, slice->ulysses);
    Require(static_cast<int64_t>(index.size()) == layout->attention_rows,
            "the attention order covers the bag's tokens");
  }
}

void CheckSolved(const Plan& plan, const World& world, const RankLengths& lengths) {
  absl::Status valid = ValidatePlan(plan, world, lengths);
  Require(valid.ok(), "the plan is valid", valid.ToString());
  valid = ValidateSlices(plan, lengths);
  Require(valid.ok(), "the slices are valid", valid.ToString());
  for (int32_t rank = 0; rank < plan.world_size; ++rank) {
    const int64_t rows = std::accumulate(lengths[rank].begin(), lengths[rank].end(), int64_t{0});
    if (rows <= kMaxRowsToList) CheckSlice(plan, world, lengths, rank);
  }
}

}  // namespace

void SolveAndCheck(const World& world, const CostModel& cost, const RankLengths& lengths,
                   const BalancerOptions& options) {
  absl::StatusOr<Plan> plan = BalanceGreedy(world, cost, lengths, options);
  if (!plan.ok()) {
    Require(!plan.status().message().empty(), "a refused step says why");
    return;
  }
  CheckSolved(*plan, world, lengths);
}

void SolveStepAndCheck(const StepProblem& problem, const BalancerInput& input,
                       const BalancerOptions& options, int64_t route_token_bytes) {
  const RankLengths& lengths = input.lengths();
  absl::StatusOr<SolvedStep> solved =
      SolveStep(problem, problem.cost, BalancerInput(input), options, route_token_bytes);
  if (!solved.ok()) {
    Require(!solved.status().message().empty(), "a refused step says why");
    return;
  }
  absl::StatusOr<World> world = WorldOfLayout(problem, solved->plan.topology);
  Require(world.ok(), "the plan's layout is one the problem allows", world.status().ToString());
  CheckSolved(solved->plan, *world, lengths);
}

}  // namespace knapformer::fuzz
