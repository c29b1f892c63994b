#include "planner/balance_stats.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "planner/packing_bound.h"
#include "planner/rank_speeds.h"

namespace knapformer {

BalanceStats ComputeBalanceStats(const std::vector<double>& workload) {
  BalanceStats stats;
  if (workload.empty()) return stats;
  double sum = 0;
  stats.max = workload[0];
  stats.min = workload[0];
  for (double w : workload) {
    sum += w;
    stats.max = std::max(stats.max, w);
    stats.min = std::min(stats.min, w);
  }
  stats.mean = sum / static_cast<double>(workload.size());
  if (stats.max == 0) return stats;  // nothing to do anywhere: balanced
  stats.wir = stats.min > 0 ? stats.max / stats.min : std::numeric_limits<double>::infinity();
  stats.max_over_mean = stats.max / stats.mean;
  return stats;
}

BalanceStats ComputeTimeStats(const std::vector<double>& time, double ideal) {
  BalanceStats stats = ComputeBalanceStats(time);
  stats.mean = ideal;
  stats.max_over_mean = stats.max > 0 && ideal > 0 ? stats.max / ideal : 1.0;
  return stats;
}

PlanBalance BalanceOf(const Plan& plan, const std::vector<double>& speeds) {
  PlanBalance balance{ComputeBalanceStats(plan.workload_before),
                      ComputeBalanceStats(plan.workload_after)};
  if (NormalizedRankSpeeds(speeds).empty()) return balance;
  const double ideal = balance.after.mean;
  balance.before = ComputeTimeStats(TimeAtHome(plan, speeds), ideal);
  balance.after = ComputeTimeStats(TimePerRank(plan, speeds), ideal);
  return balance;
}

double MaxOverMeanLowerBound(const World& world, const CostModel& cost,
                             const RankLengths& lengths, const RankMasks* masks,
                             const std::vector<double>& speeds) {
  const int32_t group = world.group_size();
  const std::vector<double> normalized = NormalizedRankSpeeds(speeds);
  double total = 0;
  double bound = 0;
  std::vector<double> workloads;
  // Per bag size: the size and the fastest bag's speed per GPU (its
  // slowest GPU's). One speed: every size at 1, and the largest size gives
  // the least, as it did before speeds.
  std::vector<std::pair<int32_t, double>> sizes;
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    const Topology& topology = world.replica_topology(replica);
    const int64_t gpus = topology.max_bag_gpus();
    // Each bag at its slowest GPU's normalized speed: across replicas too,
    // so a replica of slow GPUs is bounded by its own speed.
    double total_speed = 0, fastest = 0;
    sizes.clear();
    for (const Bag& bag : topology.bags()) {
      const double per_gpu =
          normalized.empty() ? 1.0
                             : SlowestSpeed(normalized, replica * group + bag.first_rank, bag.gpus);
      const double speed = bag.gpus * per_gpu;
      total_speed += speed;
      fastest = std::max(fastest, speed);
      if (sizes.empty() || sizes.back().first != bag.gpus) {
        sizes.emplace_back(bag.gpus, per_gpu);
      } else {
        sizes.back().second = std::max(sizes.back().second, per_gpu);
      }
    }
    double replica_total = 0;
    workloads.clear();
    for (int32_t rank = replica * group; rank < (replica + 1) * group; ++rank) {
      for (size_t i = 0; i < lengths[rank].size(); ++i) {
        const int64_t length = lengths[rank][i];
        const AttentionMask* mask = MaskOf(masks, rank, i);
        const double workload = cost.Workload(length, mask);
        replica_total += workload;
        if (length > 0) workloads.push_back(workload);
        const double attention = cost.Attention(length, mask);
        double alone = std::numeric_limits<double>::infinity();
        for (const auto& [size, speed] : sizes) {
          const int64_t largest_chunk = (length + size - 1) / size;
          const double time = cost.Linear(largest_chunk) + attention / size;
          alone = std::min(alone, speed == 1.0 ? time : time / speed);
        }
        bound = std::max(bound, alone);
      }
    }
    total += replica_total;
    bound = std::max(bound, replica_total / total_speed);
    if (topology.bags().front().gpus == gpus) {
      // A bag's time is at least its workload over the fastest bag's speed.
      std::sort(workloads.begin(), workloads.end(), std::greater<double>());
      const double scale = fastest / static_cast<double>(gpus);  // 1 with one speed
      bound = UniformBagsLowerBound(workloads, topology.num_bags(), static_cast<int32_t>(gpus),
                                    bound * scale) /
              scale;
    }
  }
  if (total == 0) return 1.0;
  return bound / (total / world.world_size());
}

}  // namespace knapformer
