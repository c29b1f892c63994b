#ifndef KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_
#define KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_

#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"
#include "proto/step_problem.h"

namespace knapformer::fuzz {

// Solves as the service does and requires what users rely on: the solver
// either refuses with a status or returns a plan that passes the validator;
// and every rank's slice, sent as the service sends it, is accepted by the
// client's checks (client/route_layout.h) with a consistent layout.
void SolveAndCheck(const World& world, const CostModel& cost, const RankLengths& lengths,
                   const BalancerOptions& options);

// The same for a request's problem, solved as the service solves it
// (SolveStep: a fixed topology, or "auto" choosing its layout), the plan
// checked on the world of the layout it names.
// With the input's masks, every rank's slice must also name one valid mask
// per sequence its attention sees, that sequence's own.
void SolveStepAndCheck(const StepProblem& problem, const BalancerInput& input,
                       const BalancerOptions& options, int64_t route_token_bytes);

}  // namespace knapformer::fuzz

#endif  // KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_
