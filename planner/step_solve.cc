#include "planner/step_solve.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/rank_speeds.h"

namespace knapformer {

absl::StatusOr<SolvedStep> SolveStep(const StepProblem& problem, const CostModel& cost,
                                     BalancerInput&& input, const BalancerOptions& options,
                                     int64_t route_token_bytes) {
  if (absl::Status status = BalancerInput::CheckRanks(input.world_size(), problem.world_size);
      !status.ok()) {
    return status;
  }
  SolvedStep solved;
  std::optional<CommPrices> prices;
  if (PricedInFlops(cost.kind())) {
    absl::StatusOr<CommPrices> created =
        CommPrices::Create(problem.machine, cost, route_token_bytes);
    if (!created.ok()) return created.status();
    prices = *created;
  }
  if (problem.auto_layout.has_value()) {
    if (!prices.has_value()) {
      return absl::InvalidArgumentError(
          "cost_model: auto layouts need the transformer or measured model");
    }
    absl::StatusOr<AutoPlan> chosen =
        BalanceAuto(*problem.auto_layout, cost, *prices, std::move(input), options);
    if (!chosen.ok()) return chosen.status();
    solved.plan = std::move(chosen->plan);
    solved.predicted = chosen->predicted;
  } else {
    absl::StatusOr<Plan> plan = BalanceGreedy(*problem.world, cost, std::move(input), options);
    if (!plan.ok()) return plan.status();
    solved.plan = *std::move(plan);
    if (prices.has_value()) {
      // The input's lengths stayed; its masks are the plan's now.
      solved.predicted =
          PredictStep(solved.plan, *problem.world, input.lengths(), cost, *prices,
                      solved.plan.MasksOrNull(), NormalizedRankSpeeds(options.rank_speeds));
    }
  }
  if (solved.predicted.has_value()) {
    solved.predicted_seconds = solved.predicted->time / problem.machine.flops_per_second;
  }
  return solved;
}

absl::StatusOr<World> WorldOfLayout(const StepProblem& problem, absl::string_view layout) {
  auto refused = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat("the answer's layout '", layout, "' ", why,
                                            " (the step's topology is ", problem.topology, ")"));
  };
  if (problem.world != nullptr) {
    // Planners before layouts existed answer none for a fixed topology.
    if (!layout.empty() && layout != problem.world->spec()) {
      return refused("is not the step's topology");
    }
    return *problem.world;
  }
  absl::StatusOr<World> world = World::FromLayout(layout, problem.world_size);
  if (!world.ok()) return refused(world.status().message());
  if (absl::Status chosen = problem.auto_layout->CheckChosen(*world, problem.machine);
      !chosen.ok()) {
    return refused(chosen.message());
  }
  return world;
}

}  // namespace knapformer
