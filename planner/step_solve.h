#ifndef KNAPFORMER_PLANNER_STEP_SOLVE_H_
#define KNAPFORMER_PLANNER_STEP_SOLVE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/auto_layout.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/step_time.h"
#include "planner/topology.h"

namespace knapformer {

// What one step asks the planner to solve: a fixed world (a topology
// replicated over world_size ranks) or an auto layout, the cost model and
// the machine that prices communication. The service and the client's local
// planning both solve steps through it (from a StepSpec:
// proto/step_problem.h), so that a step planned either way gets the same
// plan.
struct StepProblem {
  // The canonical topology: the fixed spec ("g1n2+g2n1+g4n1") or the auto
  // layout's ("auto:max_bag=8"). Ranks of one step must agree on it.
  std::string topology;
  int32_t world_size = 0;
  // Set for a fixed topology; shared: building one is O(world size).
  std::shared_ptr<const World> world;
  // Set for "auto".
  std::optional<AutoLayout> auto_layout;
  Machine machine;
  CostModel cost;
};

// One solved step.
struct SolvedStep {
  Plan plan;  // plan.topology: the layout solved on
  // The predicted step time of the plan (step_time.h); unset for cost
  // models other than the transformer, which price no communication.
  std::optional<PredictedStep> predicted;
  // predicted->time in seconds of the problem's machine; 0 when unset.
  double predicted_seconds = 0;
};

// Solves `problem` for every rank's lengths and masks in `input` (checked
// where they entered) with `cost` (the problem's, or a fitted one of the same
// kind), `options` (BalancerOptionsForSpec in proto/plan_proto.h) and
// `route_token_bytes` (0 = the hidden states alone). Fixed topologies are
// solved exactly as BalanceGreedy does; "auto" with BalanceAuto. The input's
// masks move into the plan (its lengths stay): a caller that still needs
// them passes a copy.
// InvalidArgument for an input of another world size than the problem's.
absl::StatusOr<SolvedStep> SolveStep(const StepProblem& problem, const CostModel& cost,
                                     BalancerInput&& input, const BalancerOptions& options,
                                     int64_t route_token_bytes);

// The world a plan of `problem` was made on, from its layout (an answer's
// Balance.layout). Internal naming the layout when it is not one the
// problem allows (a fixed topology's own spec, or none; under auto, a layout
// auto may choose on the problem's machine).
absl::StatusOr<World> WorldOfLayout(const StepProblem& problem, absl::string_view layout);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_STEP_SOLVE_H_
