#ifndef KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_
#define KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_

#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"

namespace knapformer::fuzz {

// Solves as the service does and requires what users rely on: the solver
// either refuses with a status or returns a plan that passes the validator;
// and every rank's slice, sent as the service sends it, is accepted by the
// client's checks (client/route_layout.h) with a consistent layout.
void SolveAndCheck(const World& world, const CostModel& cost, const RankLengths& lengths,
                   const BalancerOptions& options);

}  // namespace knapformer::fuzz

#endif  // KNAPFORMER_TESTS_FUZZ_SOLVE_CHECK_H_
