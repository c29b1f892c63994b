#ifndef KNAPFORMER_PLANNER_STEP_TIME_H_
#define KNAPFORMER_PLANNER_STEP_TIME_H_

#include <cstdint>
#include <vector>

#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/topology.h"

namespace knapformer {

// A step's predicted time on its slowest GPU, per transformer block, in the
// cost model's units (FLOPs; divide by Machine::flops_per_second for
// seconds). A GPU's time is
//  - compute: the linear work of the tokens it holds after routing plus its
//    1/G of its bag's attention (the cost model, as Plan::workload_after),
//    over its bag's slowest speed when the ranks have speeds (rank_speeds.h;
//    `speeds` below: normalized, NormalizedRankSpeeds, or empty for one
//    speed);
//  - ulysses: its tokens times CommPrices::UlyssesPerToken of its bag;
//  - route: the larger of the tokens it sends and receives in the route,
//    within its node and across nodes, times CommPrices::RoutePerToken.
// Tokens per GPU are exact (the chunking's rotation, replayed); what a bag
// receives is spread evenly over its GPUs. Deterministic: the same plan gives
// the same figures bit for bit, whichever way it was reached.
struct PredictedStep {
  double time = 0;  // max over GPUs of compute + ulysses + route
  // The slowest GPU's parts of `time`.
  double compute = 0;
  double ulysses = 0;
  double route = 0;
  int32_t slowest_rank = 0;
  double max_compute = 0;  // max over GPUs of compute alone
};

// One replica under `topology`, its ranks [first_rank, first_rank + group):
// bag_of[id] is the replica-relative bag of each of its sequences (-1 for an
// empty one), ids from `first_sequence` (internal::FirstSequences).
PredictedStep PredictReplica(const Topology& topology, int32_t first_rank,
                             const RankLengths& lengths,
                             const std::vector<int32_t>& first_sequence,
                             const std::vector<int32_t>& bag_of, const CostModel& cost,
                             const CommPrices& prices, const RankMasks* masks = nullptr,
                             const std::vector<double>& speeds = {});

// The slower of two parts of one world, `earlier` covering lower ranks
// (ties: `earlier`), with the max_compute of both.
PredictedStep Slower(const PredictedStep& earlier, const PredictedStep& later);

// The whole plan: the slowest GPU over its replicas (ties: the lowest rank).
// REQUIRES: `plan` is a valid plan of `lengths` on `world` (ValidatePlan).
// `masks` (null or empty: all full) price the attention.
PredictedStep PredictStep(const Plan& plan, const World& world, const RankLengths& lengths,
                          const CostModel& cost, const CommPrices& prices,
                          const RankMasks* masks = nullptr,
                          const std::vector<double>& speeds = {});

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_STEP_TIME_H_
