#ifndef KNAPFORMER_PLANNER_BALANCE_STATS_H_
#define KNAPFORMER_PLANNER_BALANCE_STATS_H_

#include <vector>

#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"

namespace knapformer {

// How balanced per-GPU workloads are. The step waits for the slowest GPU, so
// max_over_mean is what sets step time; wir (max / min, the paper's workload
// imbalance ratio) is +infinity when some GPU has nothing and 1 when all are 0.
struct BalanceStats {
  double max = 0;
  double min = 0;
  double mean = 0;
  double wir = 1;
  double max_over_mean = 1;
};

BalanceStats ComputeBalanceStats(const std::vector<double>& workload);

// The same for times per rank (rank_speeds.h: TimePerRank, TimeAtHome):
// max, min and wir of the times, and max_over_mean against `ideal`, the
// time of a perfectly balanced step (the total workload over the total
// speed: the mean workload under normalized speeds), which `mean` holds.
BalanceStats ComputeTimeStats(const std::vector<double>& time, double ideal);

// A plan's balance without balancing (each rank on its own sequences) and
// under the plan: of its workloads when `speeds` is empty or one value, else
// of time on them (TimeAtHome, TimePerRank) against the ideal, the mean
// workload (speeds normalized to mean 1).
struct PlanBalance {
  BalanceStats before;
  BalanceStats after;
};
PlanBalance BalanceOf(const Plan& plan, const std::vector<double>& speeds);

// A lower bound on max/mean that no plan on `world` can beat: the max is at
// least the mean of the busiest replica, and at least what the heaviest
// sequence puts on one GPU of the largest bag (ceil(l/G) tokens of linear work
// plus 1/G of its attention), and, where every bag of a replica has G GPUs,
// what packing its whole sequences into those bags needs (packing_bound.h:
// pigeonhole and Martello-Toth L2).
// `masks` (null or empty: all full) price the attention.
//
// With rank speeds (rank_speeds.h; empty: one speed) the bound is on the
// slowest GPU's time (TimePerRank) over the ideal, the total workload over
// the total speed: the busiest replica's workload over its bags' speeds, the
// heaviest sequence alone in the fastest bag of each size (the least of
// those), and the packing bound in bags at the fastest bag's speed.
double MaxOverMeanLowerBound(const World& world, const CostModel& cost,
                             const RankLengths& lengths, const RankMasks* masks = nullptr,
                             const std::vector<double>& speeds = {});

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BALANCE_STATS_H_
